//! The listener: HTTP/1.1 and h2c (prior knowledge) on one port, a bound on connections, idle
//! and slow connections reaped, graceful shutdown.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body::Body;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::app::App;
use crate::config::Config;
use crate::headers::PROXY_ERROR;
use crate::inbound::{ClientAddress, ConnectionPlace};

mod connections;

pub use connections::ConnectionSlots;
use connections::{Lingering, Slot, Tracked};

const CLOSE: hyper::header::HeaderValue = hyper::header::HeaderValue::from_static("close");

/// Installs the process-wide rustls crypto provider (ring); harmless when already installed.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub async fn bind(config: &Config) -> std::io::Result<TcpListener> {
    TcpListener::bind(&config.listen).await
}

/// Raises the soft open-files limit to the hard one (a default soft limit of 1024 or less would
/// otherwise cap connections long before `limits.max_connections`); returns the limit in force.
pub fn raise_fd_limit() -> Option<u64> {
    rlimit::increase_nofile_limit(u64::MAX).ok()
}

/// The connection cap that fits in `fd_limit`: each client connection may hold an upstream
/// connection too, and some descriptors stay for the listener, logs and the summarizer.
pub fn connection_cap(configured: usize, fd_limit: Option<u64>) -> usize {
    match fd_limit {
        Some(limit) => configured.min((limit.saturating_sub(64) / 2).max(1) as usize),
        None => configured,
    }
}

/// How a connection is served: built once, shared by every connection.
struct Serving {
    builder: auto::Builder<TokioExecutor>,
    idle_timeout: Duration,
}

/// Serves until `shutdown` resolves, then stops accepting and lets in-flight requests and
/// streams finish for up to `shutdown_grace_secs`. Returns whether everything finished in time.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let limits = &app.config().limits;
    let slots = ConnectionSlots::new(limits.max_connections, limits);
    serve_on(listener, app, shutdown, slots).await
}

/// [`serve`] with connection slots that other listeners (the other workers) may share.
pub async fn serve_on(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
    slots: ConnectionSlots,
) -> bool {
    let config = app.config();
    let limits = &config.limits;
    let grace = Duration::from_secs_f64(config.shutdown_grace_secs);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's read buffer holds a request's headers until they are whole: its size bounds
    // what an unterminated header costs (hyper's default is about 400 KB a connection).
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(limits.max_header_bytes.max(8192))
        .header_read_timeout(Duration::from_secs_f64(limits.header_read_timeout_secs));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32);
    let serving = Arc::new(Serving {
        builder,
        idle_timeout: Duration::from_secs_f64(limits.idle_connection_timeout_secs),
    });
    let tracker = TaskTracker::new();
    let (stop, stopping) = watch::channel(false);
    let mut backoff = AcceptBackoff::default();
    app.set_ready(true);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => {
                        backoff.reset();
                        accepted
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        let pause = backoff.next();
                        tracing::warn!("accept failed, pausing {pause:?}: {e}");
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                };
                // Small writes (SSE frames) must leave at once, not wait for a delayed ACK.
                let _ = stream.set_nodelay(true);
                let address = peer.ip().to_canonical();
                match slots.admit(address) {
                    Some(slot) => {
                        let (app, serving, stopping) = (app.clone(), serving.clone(), stopping.clone());
                        tracker.spawn(async move {
                            serve_connection(stream, address, app, &serving, stopping, slot).await;
                        });
                    }
                    None => {
                        tracker.spawn(refuse_connection(stream, slots.cap));
                    }
                }
            }
            () = &mut shutdown => break,
        }
    }
    app.set_ready(false);
    drop(listener);
    let _ = stop.send(true);
    tracker.close();
    // "shutting down" is said once by the binary, not once per worker here.
    match tokio::time::timeout(grace, tracker.wait()).await {
        Ok(()) => true,
        Err(_) => {
            tracing::warn!("grace period over; closing this worker's remaining connections");
            false
        }
    }
}

/// `count` listening sockets on one address, each with `SO_REUSEPORT` so the kernel spreads new
/// connections over them; with port 0 the first picks the port and the others share it.
pub fn bind_reuseport(listen: &str, count: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::net::ToSocketAddrs;
    let mut addr = listen.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to listen on")
    })?;
    let mut listeners = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        #[cfg(unix)]
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        let listener: std::net::TcpListener = socket.into();
        addr = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// Serves one connection until it ends, is idle too long, is closed to make room for another,
/// or shutdown asks it to finish.
async fn serve_connection(
    stream: TcpStream,
    address: IpAddr,
    app: Arc<App>,
    serving: &Serving,
    mut stopping: watch::Receiver<bool>,
    slot: Slot,
) {
    let activity = slot.activity.clone();
    let evicted = slot.evicted.clone();
    let lingering = slot.lingering.clone();
    let place = Arc::new(slot);
    let linger = Arc::new(AtomicBool::new(false));
    let service = {
        let (activity, linger, place) = (activity.clone(), linger.clone(), place.clone());
        service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            let (app, linger) = (app.clone(), linger.clone());
            let guard = activity.begin();
            request.extensions_mut().insert(ClientAddress(address));
            if request.headers().contains_key(hyper::header::UPGRADE) {
                // A relay goes on holding this connection's place after the handler returns.
                request
                    .extensions_mut()
                    .insert(ConnectionPlace(place.clone()));
            }
            async move {
                let response = handle_marking_linger(app, request, &linger).await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| Tracked {
                    body,
                    _guard: guard,
                }))
            }
        })
    };
    let io = Lingering {
        stream: Some(stream),
        linger,
        permits: lingering,
        activity: activity.clone(),
    };
    let connection = serving
        .builder
        .serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut finishing = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection ended with an error: {e}");
                }
                return;
            }
            _ = stopping.wait_for(|stop| *stop), if !finishing => {
                connection.as_mut().graceful_shutdown();
                finishing = true;
            }
            () = activity.idle_for(serving.idle_timeout), if !finishing => {
                connection.as_mut().graceful_shutdown();
                finishing = true;
            }
            () = evicted.notified(), if !finishing => {
                if activity.in_flight() == 0 {
                    return;
                }
                // A request began as it was chosen: it finishes, then the connection closes.
                connection.as_mut().graceful_shutdown();
                finishing = true;
            }
        }
    }
}

/// One request handled; answered with an error while its body may still be coming, the
/// connection is marked to linger on close.
async fn handle_marking_linger(
    app: Arc<App>,
    request: hyper::Request<hyper::body::Incoming>,
    linger: &AtomicBool,
) -> Result<hyper::Response<crate::access_log::LoggedBody>, std::convert::Infallible> {
    let sends_body = !request.body().is_end_stream();
    let http1 = request.version() < hyper::Version::HTTP_2;
    let mut response = crate::proxy::handle(app, request).await?;
    if sends_body && response.status().as_u16() >= 400 {
        // Answered, perhaps before the body was read: closing now would reset the connection
        // under a client still writing, and lose the answer.
        linger.store(true, Ordering::Release);
        if http1 && response.headers().contains_key(PROXY_ERROR) {
            // compactor's own refusals come before the body is read: the connection then
            // closes, and saying so keeps the client from sending its next request on it (a
            // "remote disconnected" error for a request never read).
            response
                .headers_mut()
                .insert(hyper::header::CONNECTION, CLOSE);
        }
    }
    Ok(response)
}

/// Past the cap: a plain 503 the client can read, then the connection is closed.
async fn refuse_connection(mut stream: TcpStream, cap: usize) {
    let body = format!(
        r#"{{"error":{{"message":"compactor is at its connection limit ({cap}); retry shortly","type":"server_error","code":"overloaded","param":null}}}}"#
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nx-compactor-error: overloaded\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

#[derive(Default)]
struct AcceptBackoff(u32);

impl AcceptBackoff {
    fn next(&mut self) -> Duration {
        self.0 = (self.0 + 1).min(8);
        Duration::from_millis(5 << self.0).min(Duration::from_secs(1))
    }
    fn reset(&mut self) {
        self.0 = 0;
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are registered when this is called, not when
/// the future is first polled: call it before the address is announced, since a signal that
/// arrives before registration takes its default action and ends the process without a drain.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let terminate = signal(SignalKind::terminate());
        let interrupt = signal(SignalKind::interrupt());
        async move {
            match (terminate, interrupt) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (Ok(mut one), Err(_)) | (Err(_), Ok(mut one)) => {
                    one.recv().await;
                }
                (Err(_), Err(_)) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Prints the line black-box tests and scripts wait for.
pub fn announce(name: &str, addr: SocketAddr) {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{name} listening on http://{addr}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests;
