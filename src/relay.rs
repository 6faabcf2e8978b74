//! `websocket: relay`: a WebSocket upgrade is passed to the upstream, and once both sides have
//! switched protocols the two connections are joined byte for byte. Nothing on a relayed socket
//! is read or compacted. A relay keeps the place of the client connection it came on, busy, so
//! it counts against `limits.max_connections` and `max_connections_per_ip` and is never closed
//! to make room; it is closed after `limits.idle_connection_timeout_secs` with no byte either
//! way, and after `limits.relay_max_lifetime_secs` whatever moves. A key with a model list gets
//! no relay: frames are never read, so their model could not be checked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::body::{self, ProxyBody};
use crate::error::ProxyError;
use crate::headers::strip_own;
use crate::inbound::ConnectionPlace;
use crate::upstream::Upstream;

/// How many relays may be open at once, how long one may sit silent, and how long one may
/// last.
#[derive(Clone)]
pub struct RelayLimits {
    pub slots: Arc<Semaphore>,
    pub idle_timeout: Duration,
    pub lifetime: Duration,
}

/// Sends the client's upgrade request upstream; on `101 Switching Protocols` answers the client
/// with the upstream's 101 and joins the two upgraded connections in the background. Any other
/// answer goes back to the client as it came.
pub async fn relay(
    upstream: &Upstream,
    uri: Uri,
    mut parts: http::request::Parts,
    limits: &RelayLimits,
) -> Result<Response<ProxyBody>, ProxyError> {
    let client_side = parts.extensions.remove::<OnUpgrade>().ok_or_else(|| {
        ProxyError::BadRequest("a WebSocket upgrade needs an HTTP/1.1 connection".into())
    })?;
    let slot = limits
        .slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| ProxyError::Overloaded("WebSocket relays"))?;
    // The client connection's place goes with the relay: it still holds a socket.
    let place = parts
        .extensions
        .remove::<ConnectionPlace>()
        .map(ConnectionPlace::hold);
    let upgrade = parts.headers.get(header::UPGRADE).cloned();
    let mut request = upstream.prepare_request(Method::GET, uri, parts.headers, body::empty());
    // `prepare_request` drops hop-by-hop headers; the upgrade is the one this request is for.
    restore_upgrade(request.headers_mut(), upgrade);
    let sent = tokio::time::timeout(
        upstream.first_byte_timeout,
        upstream.client.request(request),
    );
    let mut response = match sent.await {
        Err(_) => {
            return Err(ProxyError::UpstreamTimeout {
                upstream: upstream.name.clone(),
                secs: upstream.first_byte_timeout.as_secs_f64(),
            })
        }
        Ok(Err(e)) => {
            return Err(ProxyError::UpstreamUnreachable {
                upstream: upstream.name.clone(),
                reason: e.to_string(),
            })
        }
        Ok(Ok(response)) => response,
    };
    strip_own(response.headers_mut());
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(response.map(|b| {
            b.map_err(|e| -> body::BoxError { Box::new(e) })
                .boxed_unsync()
        }));
    }
    let upstream_side = hyper::upgrade::on(&mut response);
    let (idle_timeout, lifetime) = (limits.idle_timeout, limits.lifetime);
    tokio::spawn(async move {
        let (Ok(client), Ok(server)) = tokio::join!(client_side, upstream_side) else {
            return;
        };
        if tokio::time::timeout(lifetime, join(client, server, idle_timeout))
            .await
            .is_err()
        {
            tracing::debug!("WebSocket relay closed at its lifetime of {lifetime:?}");
        }
        drop((slot, place));
    });
    let (parts, _) = response.into_parts();
    Ok(Response::from_parts(parts, body::empty()))
}

fn restore_upgrade(headers: &mut HeaderMap, upgrade: Option<HeaderValue>) {
    if let Some(upgrade) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, upgrade);
    }
}

/// Copies both ways until either side closes, or nothing has moved for `idle_timeout`.
async fn join(client: Upgraded, server: Upgraded, idle_timeout: Duration) {
    let started = Instant::now();
    let last_byte = Arc::new(AtomicU64::new(0));
    let (client_read, client_write) = tokio::io::split(TokioIo::new(client));
    let (server_read, server_write) = tokio::io::split(TokioIo::new(server));
    let up = copy(client_read, server_write, started, last_byte.clone());
    let down = copy(server_read, client_write, started, last_byte.clone());
    let watchdog = async {
        loop {
            tokio::time::sleep(idle_timeout / 4).await;
            let now = started.elapsed().as_millis() as u64;
            let silent = now.saturating_sub(last_byte.load(Ordering::Relaxed));
            if Duration::from_millis(silent) >= idle_timeout {
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        () = watchdog => tracing::debug!("WebSocket relay closed after {idle_timeout:?} of silence"),
    }
}

/// One direction: bytes as they come, then the write side shut when the read side ends.
async fn copy(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    started: Instant,
    last_byte: Arc<AtomicU64>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        last_byte.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        if to.write_all(&buffer[..read]).await.is_err() || to.flush().await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
