//! The listener: HTTP/1.1 and h2c (prior knowledge) on one port, a bound on connections, idle
//! and slow connections reaped, graceful shutdown.

use crate::poison::lock;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::app::App;
use crate::config::Config;
use crate::config::LimitsConfig;
use crate::headers::PROXY_ERROR;
use crate::inbound::{ClientAddress, ConnectionPlace, Place};

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

/// Client connections at once, shared by every worker. At the cap, or at a client address's own
/// cap, a connection with nothing in flight is closed to make room (as nginx reuses idle
/// keep-alive connections): idle sockets never lock out a client with work. At the global cap
/// it is taken from the address that holds the most, so churning sockets from other addresses
/// closes the churner's own before anyone else's; and never one that has served a request and
/// been idle for less than the grace since, so a keep-alive client between two requests keeps
/// its socket (a socket that never sent a request can go at once). Only when no connection in
/// the way can go is a new one refused.
#[derive(Clone)]
pub struct ConnectionSlots {
    registry: Arc<Mutex<Registry>>,
    cap: usize,
    per_address_cap: usize,
    grace: Duration,
    /// The clock every connection's activity is measured from, so their idleness compares.
    base: Instant,
    /// Sockets being closed lingeringly (they no longer hold a slot, but hold a descriptor).
    lingering: Arc<Semaphore>,
    header_bytes: Arc<HeaderBytes>,
}

/// Bytes of request headers read and not yet part of a request, across every connection.
struct HeaderBytes {
    held: AtomicUsize,
    limit: usize,
}

impl HeaderBytes {
    /// Counts `bytes` more; false (and nothing counted) when that would pass the limit.
    fn take(&self, bytes: usize) -> bool {
        let before = self.held.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > self.limit {
            self.held.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn give_back(&self, bytes: usize) {
        if bytes > 0 {
            self.held.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    open: HashMap<u64, OpenConnection>,
    per_address: HashMap<IpAddr, usize>,
}

struct OpenConnection {
    address: IpAddr,
    activity: Arc<Activity>,
    evict: Arc<Notify>,
}

/// A connection place held busy by a relay.
struct HeldPlace {
    _guard: ActivityGuard,
    _place: Arc<Slot>,
}

impl Place for Slot {
    fn hold(self: Arc<Self>) -> Box<dyn Send> {
        Box::new(HeldPlace {
            _guard: self.activity.begin(),
            _place: self,
        })
    }
}

/// One admitted connection's place; given back when the connection ends.
struct Slot {
    registry: Arc<Mutex<Registry>>,
    lingering: Arc<Semaphore>,
    id: u64,
    activity: Arc<Activity>,
    /// Told when the connection is closed to make room for a new one.
    evicted: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.registry).remove(self.id);
    }
}

impl Registry {
    fn remove(&mut self, id: u64) {
        let Some(gone) = self.open.remove(&id) else {
            return;
        };
        if let Some(count) = self.per_address.get_mut(&gone.address) {
            *count -= 1;
            if *count == 0 {
                self.per_address.remove(&gone.address);
            }
        }
    }

    /// Closes a connection with nothing in flight that never served a request or has been idle
    /// since `grace_until` (a time on the activity clock) or before: from `address` when given,
    /// else from the address holding the most; the idlest of those. Whether one was.
    fn evict_idlest(&mut self, address: Option<IpAddr>, grace_until: u64) -> bool {
        let per_address = &self.per_address;
        let idlest = self
            .open
            .iter()
            .filter(|(_, open)| address.is_none_or(|a| open.address == a))
            .filter(|(_, open)| open.activity.in_flight() == 0)
            .filter(|(_, open)| {
                !open.activity.has_served() || open.activity.changed_at() <= grace_until
            })
            .min_by_key(|(_, open)| {
                let held = per_address.get(&open.address).copied().unwrap_or(0);
                (std::cmp::Reverse(held), open.activity.changed_at())
            })
            .map(|(id, _)| *id);
        let Some(id) = idlest else {
            return false;
        };
        if let Some(open) = self.open.get(&id) {
            open.evict.notify_one();
        }
        // Its place is the newcomer's from now: it closes as soon as its task runs.
        self.remove(id);
        true
    }
}

impl ConnectionSlots {
    /// The caps of `limits` (`max_connections_per_ip` 0: no cap per client address), with the
    /// connection cap `cap` (which may be lowered to fit the descriptor limit).
    pub fn new(cap: usize, limits: &LimitsConfig) -> ConnectionSlots {
        let cap = cap.max(1);
        let per_address_cap = match limits.max_connections_per_ip {
            0 => cap,
            n => n.min(cap),
        };
        ConnectionSlots {
            registry: Arc::default(),
            cap,
            per_address_cap,
            grace: Duration::from_secs_f64(limits.eviction_grace_secs.max(0.0)),
            base: Instant::now(),
            lingering: Arc::new(Semaphore::new((cap / 8).max(16))),
            header_bytes: Arc::new(HeaderBytes {
                held: AtomicUsize::new(0),
                limit: limits.max_header_bytes_total,
            }),
        }
    }

    /// A place for a connection from `address`, making room by closing an idle connection when
    /// a cap is reached; `None` when every connection in the way is busy.
    fn admit(&self, address: IpAddr) -> Option<Slot> {
        let mut registry = lock(&self.registry);
        let now = self.base.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        let grace_until = now.saturating_sub(self.grace.as_nanos().min(u64::MAX as u128) as u64);
        let from_address = registry.per_address.get(&address).copied().unwrap_or(0);
        if from_address >= self.per_address_cap
            && !registry.evict_idlest(Some(address), grace_until)
        {
            return None;
        }
        if registry.open.len() >= self.cap && !registry.evict_idlest(None, grace_until) {
            return None;
        }
        let id = registry.next_id;
        registry.next_id += 1;
        let activity = Arc::new(Activity::new(self.base, self.header_bytes.clone()));
        let evicted = Arc::new(Notify::new());
        registry.open.insert(
            id,
            OpenConnection {
                address,
                activity: activity.clone(),
                evict: evicted.clone(),
            },
        );
        *registry.per_address.entry(address).or_insert(0) += 1;
        Some(Slot {
            registry: self.registry.clone(),
            lingering: self.lingering.clone(),
            id,
            activity,
            evicted,
        })
    }
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
            let sends_body = !request.body().is_end_stream();
            let http1 = request.version() < hyper::Version::HTTP_2;
            request.extensions_mut().insert(ClientAddress(address));
            if request.headers().contains_key(hyper::header::UPGRADE) {
                // A relay goes on holding this connection's place after the handler returns.
                request
                    .extensions_mut()
                    .insert(ConnectionPlace(place.clone()));
            }
            async move {
                let mut response = crate::proxy::handle(app, request).await?;
                if sends_body && response.status().as_u16() >= 400 {
                    // Answered, perhaps before the body was read: closing now would reset the
                    // connection under a client still writing, and lose the answer.
                    linger.store(true, Ordering::Release);
                    if http1 && response.headers().contains_key(PROXY_ERROR) {
                        // compactor's own refusals come before the body is read: the connection
                        // then closes, and saying so keeps the client from sending its next
                        // request on it (a "remote disconnected" error for a request never
                        // read).
                        response
                            .headers_mut()
                            .insert(hyper::header::CONNECTION, CLOSE);
                    }
                }
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

/// The client socket, closed lingeringly when an answer may have left before the request body
/// was read: the write side is shut first so the answer and a FIN reach the client, then what
/// it still sends is read and dropped for a bounded time, so closing does not reset the
/// connection and discard the answer in the client's receive buffer (nginx's lingering close).
/// Lingering sockets are bounded in number (an eighth of the connection cap); past that a
/// socket is closed at once, as before.
struct Lingering {
    stream: Option<TcpStream>,
    linger: Arc<AtomicBool>,
    permits: Arc<Semaphore>,
    /// Counts the bytes read while no request is in flight (headers still arriving) against
    /// `limits.max_header_bytes_total`.
    activity: Arc<Activity>,
}

/// How long a lingering close reads, at most in all and at most waiting for the next bytes
/// (nginx: `lingering_time` 30 s, `lingering_timeout` 5 s).
const LINGER_TOTAL: Duration = Duration::from_secs(10);
const LINGER_QUIET: Duration = Duration::from_secs(2);

impl Drop for Lingering {
    fn drop(&mut self) {
        if !self.linger.load(Ordering::Acquire) {
            return;
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return;
        };
        let (Some(stream), Ok(runtime)) =
            (self.stream.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        runtime.spawn(async move {
            linger_then_close(stream).await;
            drop(permit);
        });
    }
}

async fn linger_then_close(mut stream: TcpStream) {
    use tokio::io::AsyncReadExt;
    let _ = stream.shutdown().await;
    let mut sink = vec![0u8; 16 * 1024];
    let deadline = Instant::now() + LINGER_TOTAL;
    while let Ok(Ok(read)) = tokio::time::timeout_at(
        deadline.min(Instant::now() + LINGER_QUIET),
        stream.read(&mut sink),
    )
    .await
    {
        if read == 0 {
            break;
        }
    }
}

impl Lingering {
    /// Runs `io` on the stream, present until the connection is dropped.
    fn with_stream<R>(
        self: Pin<&mut Self>,
        io: impl FnOnce(Pin<&mut TcpStream>) -> Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        match &mut self.get_mut().stream {
            Some(stream) => io(Pin::new(stream)),
            None => Poll::Ready(Err(std::io::ErrorKind::NotConnected.into())),
        }
    }
}

impl tokio::io::AsyncRead for Lingering {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let filled = buf.filled().len();
        let this = self.get_mut();
        let read = match &mut this.stream {
            Some(stream) => Pin::new(stream).poll_read(cx, buf),
            None => Poll::Ready(Err(std::io::ErrorKind::NotConnected.into())),
        };
        if let Poll::Ready(Ok(())) = read {
            let new = buf.filled().len() - filled;
            let activity = &this.activity;
            if new > 0 && activity.in_flight() == 0 && !activity.count_header_bytes(new) {
                return Poll::Ready(Err(std::io::Error::other(
                    "request headers in flight are over limits.max_header_bytes_total",
                )));
            }
        }
        read
    }
}

impl tokio::io::AsyncWrite for Lingering {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.with_stream(|stream| stream.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.with_stream(|stream| stream.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.with_stream(|stream| stream.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.with_stream(|stream| stream.poll_shutdown(cx))
    }
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

/// Requests in flight on one connection, when that last changed, and the header bytes it has
/// read towards its next request.
struct Activity {
    in_flight: AtomicUsize,
    base: Instant,
    /// Nanoseconds after `base` of the last request start or end (or of the connection's start).
    changed_at: AtomicU64,
    header_bytes: AtomicUsize,
    header_budget: Arc<HeaderBytes>,
    /// Whether a request ever began on it (only a client's connection earns the grace).
    served: AtomicBool,
}

struct ActivityGuard(Arc<Activity>);

impl Activity {
    fn new(base: Instant, header_budget: Arc<HeaderBytes>) -> Activity {
        let activity = Activity {
            in_flight: AtomicUsize::new(0),
            base,
            changed_at: AtomicU64::new(0),
            header_bytes: AtomicUsize::new(0),
            header_budget,
            served: AtomicBool::new(false),
        };
        activity.touch();
        activity
    }

    /// Counts `bytes` of headers towards the next request; false when over the total.
    fn count_header_bytes(&self, bytes: usize) -> bool {
        if !self.header_budget.take(bytes) {
            return false;
        }
        self.header_bytes.fetch_add(bytes, Ordering::AcqRel);
        true
    }

    fn touch(&self) {
        let nanos = self.base.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.changed_at.store(nanos, Ordering::Release);
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    fn changed_at(&self) -> u64 {
        self.changed_at.load(Ordering::Acquire)
    }

    fn has_served(&self) -> bool {
        self.served.load(Ordering::Acquire)
    }

    fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.store(true, Ordering::Release);
        self.touch();
        // The headers read so far are this request's now, bounded with it.
        self.header_budget
            .give_back(self.header_bytes.swap(0, Ordering::AcqRel));
        ActivityGuard(self.clone())
    }

    /// Resolves once no request has been in flight for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let since = self.base + Duration::from_nanos(self.changed_at());
            let idle = self.in_flight() == 0;
            if idle && since.elapsed() >= timeout {
                return;
            }
            let wake = if idle {
                since + timeout
            } else {
                Instant::now() + timeout
            };
            tokio::time::sleep_until(wake).await;
        }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.header_budget.give_back(*self.header_bytes.get_mut());
    }
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.touch();
    }
}

/// A response body that keeps its request counted as in flight until it is done.
struct Tracked<B> {
    body: B,
    _guard: ActivityGuard,
}

impl<B: Body<Data = Bytes> + Unpin> Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
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
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_the_descriptor_limit() {
        assert_eq!(connection_cap(4096, Some(1024)), 480);
        assert_eq!(connection_cap(100, Some(1 << 20)), 100);
        assert_eq!(connection_cap(100, None), 100);
        assert_eq!(connection_cap(100, Some(10)), 1);
    }

    #[test]
    fn accept_backoff_grows_to_a_second_and_resets() {
        let mut backoff = AcceptBackoff::default();
        let first = backoff.next();
        let mut last = first;
        for _ in 0..20 {
            last = backoff.next();
        }
        assert!(first < last && last == Duration::from_secs(1));
        backoff.reset();
        assert_eq!(backoff.next(), first);
    }
}
