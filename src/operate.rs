//! What the process does for its operator besides serving: reload the configuration on SIGHUP
//! and (with `reload.watch`) when the file changes, and serve `/metrics`, `/healthz` and
//! `/readyz` on a listener of their own (`admin.listen`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::App;
use crate::body;
use crate::proxy::local_route;

/// The operator's side until `stopping` turns true: the admin listener when configured, and
/// reloads.
/// `loaded` is the fingerprint of the file as it was read at start-up. SIGHUP is registered
/// when this is called (inside a runtime), so call it before the address is announced: a SIGHUP
/// that arrives before registration ends the process.
pub fn run(
    app: Arc<App>,
    path: PathBuf,
    loaded: Option<[u8; 32]>,
    stopping: watch::Receiver<bool>,
) -> impl Future<Output = ()> {
    let hangups = Hangups::register();
    operate(app, path, loaded, stopping, hangups)
}

async fn operate(
    app: Arc<App>,
    path: PathBuf,
    loaded: Option<[u8; 32]>,
    stopping: watch::Receiver<bool>,
    hangups: Hangups,
) {
    let stopped = |mut stopping: watch::Receiver<bool>| async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    let admin = app.config().admin.listen.clone();
    if let Some(listen) = admin {
        match TcpListener::bind(&listen).await {
            Ok(listener) => {
                if let Ok(addr) = listener.local_addr() {
                    tracing::info!(%addr, "admin listening");
                    crate::server::announce("admin", addr);
                }
                tokio::spawn(serve_admin(
                    listener,
                    app.clone(),
                    stopped(stopping.clone()),
                ));
            }
            Err(e) => tracing::error!("cannot listen on admin.listen {listen}: {e}"),
        }
    }
    reload_until(&app, &path, loaded, hangups, stopped(stopping)).await;
}

/// SIGHUP, registered when made.
pub struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    /// Must run inside a runtime.
    pub fn register() -> Self {
        #[cfg(unix)]
        {
            let signal = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            {
                Ok(signal) => Some(signal),
                Err(e) => {
                    tracing::warn!("cannot listen for SIGHUP, reload by signal is off: {e}");
                    None
                }
            };
            Self { signal }
        }
        #[cfg(not(unix))]
        Self {}
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = self.signal.as_mut() {
            signal.recv().await;
            return;
        }
        std::future::pending::<()>().await;
    }
}

/// Reloads `path` into `app` on SIGHUP, and when its content changes (from `loaded`, its
/// fingerprint when last read) while `reload.watch` is on, until `shutdown` resolves.
async fn reload_until(
    app: &App,
    path: &Path,
    loaded: Option<[u8; 32]>,
    mut hangups: Hangups,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut seen = loaded;
    loop {
        let reload = app.config().reload.clone();
        // A content watch rather than file events: a Kubernetes ConfigMap changes by swapping
        // a symlink, which inotify on the file itself does not report.
        let tick = async {
            if reload.watch {
                tokio::time::sleep(Duration::from_secs_f64(reload.interval_secs)).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let hangup = hangups.next();
        tokio::select! {
            () = &mut shutdown => return,
            () = hangup => {
                tracing::info!(path = %path.display(), "SIGHUP: reloading the configuration");
                app.reload_file(path);
                seen = fingerprint(path);
            }
            () = tick => {
                let now = fingerprint(path);
                if now.is_some() && now != seen {
                    tracing::info!(path = %path.display(), "the configuration file changed: reloading");
                    app.reload_file(path);
                    seen = now;
                }
            }
        }
    }
}

/// The file's content hash: what the watch compares.
pub fn fingerprint(path: &Path) -> Option<[u8; 32]> {
    std::fs::read(path)
        .ok()
        .map(|text| Sha256::digest(text).into())
}

/// Serves the operators' routes on `listener` until `shutdown` resolves; anything else is 404.
pub async fn serve_admin(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let (app, builder) = (app.clone(), builder.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let response = local_route(&app, &request, true).unwrap_or_else(|| {
                            let mut response = http::Response::new(body::full(r#"{"error":"not found"}"#));
                            *response.status_mut() = http::StatusCode::NOT_FOUND;
                            response
                        });
                        async move { Ok::<_, std::convert::Infallible>(response) }
                    });
                    let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                });
            }
        }
    }
}

/// One GET of `url` (plain HTTP), answered 200 within `within`.
pub async fn probe(url: &str, within: Duration) -> Result<(), String> {
    fetch(url, within, 0).await.map(|_| ())
}

/// The body of one GET of `url` (plain HTTP) answered 200 within `within`, at most `limit`
/// bytes of it kept.
pub async fn fetch(url: &str, within: Duration, limit: usize) -> Result<bytes::Bytes, String> {
    use http_body_util::{BodyExt, Empty, Limited};
    use hyper_util::client::legacy::Client;
    let uri: http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let asked = async {
        let response = client.get(uri).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = Limited::new(response.into_body(), limit.max(1))
            .collect()
            .await
            .map(|body| body.to_bytes())
            .unwrap_or_default();
        if status == http::StatusCode::OK {
            Ok(body)
        } else {
            Err(format!("answered {status}"))
        }
    };
    tokio::time::timeout(within, asked)
        .await
        .map_err(|_| format!("no answer within {within:?}"))?
}
