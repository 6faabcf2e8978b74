//! The hot-path client for plain-HTTP/1.1 upstreams (vLLM, a local gateway, a sidecar): a
//! per-worker stack of checked-out connections over `hyper::client::conn::http1`. A request is
//! written by the task that handles it, with no dispatch task or channel hop in between, and
//! the connection goes back on the stack when its response body ends. TLS and HTTP/2 upstreams
//! use the pooled hyper-util client instead (ALPN, h2 multiplexing), as does the summarizer.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::body::ProxyBody;

/// Idle connections kept per worker and upstream; more are closed when their response ends.
const MAX_IDLE: usize = 256;

pub struct LeanPool {
    /// `host:port`, what the TCP connect dials.
    address: String,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// Most recently returned last: reusing the warmest connection keeps the cold ones expiring.
    idle: Mutex<VecDeque<(SendRequest<ProxyBody>, Instant)>>,
}

#[derive(Debug, thiserror::Error)]
pub enum LeanError {
    #[error("connect to {0} timed out")]
    ConnectTimeout(String),
    #[error("connect to {address}: {source}")]
    Connect {
        address: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

impl LeanPool {
    pub fn new(address: String, connect_timeout: Duration, idle_timeout: Duration) -> LeanPool {
        LeanPool {
            address,
            connect_timeout,
            idle_timeout,
            idle: Mutex::new(VecDeque::new()),
        }
    }

    /// Sends on an idle connection, or a new one. A pooled connection the upstream closed
    /// before it took the request hands the request back, and it goes once more on a fresh
    /// connection; a request that reached the wire is never replayed.
    pub async fn send(
        self: &Arc<Self>,
        request: Request<ProxyBody>,
    ) -> Result<Response<PooledBody>, LeanError> {
        let mut request = request;
        if let Some(mut sender) = self.checkout().await {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.attach(response, sender)),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(failed.into_error().into()),
                },
            }
        }
        let mut sender = self.connect().await?;
        let response = sender.send_request(request).await?;
        Ok(self.attach(response, sender))
    }

    async fn checkout(&self) -> Option<SendRequest<ProxyBody>> {
        loop {
            let (mut sender, since) = self.lock().pop_back()?;
            if since.elapsed() >= self.idle_timeout {
                continue;
            }
            // Returned at the end of its last response, so it is ready at once or closed.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<ProxyBody>, LeanError> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.address))
            .await
            .map_err(|_| LeanError::ConnectTimeout(self.address.clone()))?
            .map_err(|source| LeanError::Connect {
                address: self.address.clone(),
                source,
            })?;
        // Without NODELAY, Nagle's algorithm holds small writes until the peer's delayed ACK.
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // The connection's own errors reach the request that was using it.
            let _ = connection.await;
        });
        Ok(sender)
    }

    fn attach(
        self: &Arc<Self>,
        response: Response<Incoming>,
        sender: SendRequest<ProxyBody>,
    ) -> Response<PooledBody> {
        response.map(|inner| {
            let mut body = PooledBody {
                inner,
                owner: Some((self.clone(), sender)),
            };
            if body.inner.is_end_stream() {
                body.give_back();
            }
            body
        })
    }

    fn put_back(&self, sender: SendRequest<ProxyBody>) {
        let mut idle = self.lock();
        if idle.len() >= MAX_IDLE {
            idle.pop_front();
        }
        idle.push_back((sender, Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(SendRequest<ProxyBody>, Instant)>> {
        // The stack holds no invariant a panicking holder could break.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A response body that returns its connection to the pool once it has been read to the end;
/// dropped earlier, the connection closes with it (hyper cannot reuse a half-read response).
pub struct PooledBody {
    inner: Incoming,
    owner: Option<(Arc<LeanPool>, SendRequest<ProxyBody>)>,
}

impl PooledBody {
    fn give_back(&mut self) {
        if let Some((pool, sender)) = self.owner.take() {
            pool.put_back(sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.give_back(),
            Poll::Ready(Some(Err(_))) => self.owner = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
