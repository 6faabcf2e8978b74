//! The listener: HTTP/1.1 and h2c (prior knowledge) on one port, graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::proxy::App;

/// Installs the process-wide rustls crypto provider (ring); harmless when already installed.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub async fn bind(config: &Config) -> std::io::Result<TcpListener> {
    TcpListener::bind(&config.listen).await
}

/// Serves until `shutdown` resolves, then stops accepting and lets in-flight requests and
/// streams finish for up to `shutdown_grace_secs`. Returns whether everything finished in time.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let grace = Duration::from_secs_f64(app.config.shutdown_grace_secs);
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    app.set_ready(true);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Small writes (SSE frames) must leave at once, not wait for a delayed ACK.
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                let service = service_fn(move |request| crate::proxy::handle(app.clone(), request));
                let connection = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!("connection ended with an error: {e}");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    app.set_ready(false);
    drop(listener);
    tracing::info!("shutting down: waiting up to {grace:?} for in-flight requests");
    match tokio::time::timeout(grace, graceful.shutdown()).await {
        Ok(()) => true,
        Err(_) => {
            tracing::warn!("grace period over; closing the remaining connections");
            false
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Prints the line black-box tests and scripts wait for.
pub fn announce(name: &str, addr: SocketAddr) {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{name} listening on http://{addr}");
    let _ = out.flush();
}
