//! The client's request body, bounded in size, time and rate on every route, and the global
//! budget of request bytes held in memory. A slow or oversized body ends with a [`BodyFault`],
//! which the handler answers as the client's fault (400, 408, 413), also when it surfaces
//! through the upstream client while the body was being streamed on.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;
use crate::config::LimitsConfig;

/// The address a request's connection comes from, put in the request's extensions by the
/// listener.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddress(pub std::net::IpAddr);

/// A connection's place under the listener's caps, as something that can be held.
pub trait Place: Send + Sync {
    /// Keeps the place, busy (never closed to make room), for as long as the value lives.
    fn hold(self: Arc<Self>) -> Box<dyn Send>;
}

/// An upgrade request's connection place, put in its extensions by the listener: a WebSocket
/// relay keeps it after the handler returns, since it still holds the client's socket.
#[derive(Clone)]
pub struct ConnectionPlace(pub Arc<dyn Place>);

impl ConnectionPlace {
    pub fn hold(self) -> Box<dyn Send> {
        self.0.hold()
    }
}

/// The minimum body rate is measured over this much waiting: a body may be this far behind the
/// rate at any moment, so a stall this long ends it whatever arrived before (a burst earns no
/// more than this). Time the consumer spends not reading (the upstream pushing back) is not
/// waiting and is not counted.
const RATE_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyFault {
    #[error("request body exceeds the limit of {0} bytes")]
    TooLarge(u64),
    #[error("request body did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("request body arrived slower than {0} bytes per second")]
    TooSlow(u64),
    #[error("invalid request body: {0}")]
    Invalid(String),
}

impl BodyFault {
    /// The fault in an error's source chain, if a client body caused it.
    pub fn in_chain<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e BodyFault> {
        let mut current = Some(error);
        while let Some(e) = current {
            if let Some(fault) = e.downcast_ref::<BodyFault>() {
                return Some(fault);
            }
            current = e.source();
        }
        None
    }
}

/// The bounds every request body is read under.
#[derive(Debug, Clone, Copy)]
pub struct BodyBounds {
    pub max_bytes: u64,
    pub timeout: Duration,
    pub min_bytes_per_sec: u64,
}

impl BodyBounds {
    pub fn from_config(limits: &LimitsConfig) -> BodyBounds {
        BodyBounds {
            max_bytes: limits.max_request_body_bytes,
            timeout: Duration::from_secs_f64(limits.body_read_timeout_secs),
            min_bytes_per_sec: limits.min_body_bytes_per_sec,
        }
    }
}

/// The client's body with its bounds applied; each frame is passed on as it arrives.
pub struct GuardedBody {
    inner: Incoming,
    bounds: BodyBounds,
    received: u64,
    started: Instant,
    /// Waiting the bytes received so far have paid for, at most [`RATE_WINDOW`].
    credit: Duration,
    /// Since when the client has kept us waiting, while it does.
    waiting_since: Option<Instant>,
    /// Armed only while the client makes us wait.
    timer: Option<Pin<Box<Sleep>>>,
    failed: bool,
}

impl GuardedBody {
    pub fn new(inner: Incoming, bounds: BodyBounds) -> GuardedBody {
        GuardedBody {
            inner,
            bounds,
            received: 0,
            started: Instant::now(),
            credit: RATE_WINDOW,
            waiting_since: None,
            timer: None,
            failed: false,
        }
    }

    /// When the body is overdue: its whole deadline, or the moment the wait since its last
    /// bytes uses up the credit they and the bytes before them earned.
    fn wake_at(&self, waiting_since: Instant) -> Instant {
        let whole = self.started + self.bounds.timeout;
        if self.bounds.min_bytes_per_sec == 0 {
            return whole;
        }
        whole.min(waiting_since + self.credit)
    }

    /// Settles the wait that just ended with `bytes` arriving: the wait is paid from the
    /// credit, the bytes earn credit at the minimum rate, and the credit never exceeds the window.
    fn arrived(&mut self, bytes: usize) {
        if self.bounds.min_bytes_per_sec == 0 {
            return;
        }
        if let Some(since) = self.waiting_since.take() {
            self.credit = self.credit.saturating_sub(since.elapsed());
        }
        let earned = Duration::from_secs_f64(bytes as f64 / self.bounds.min_bytes_per_sec as f64);
        self.credit = (self.credit + earned).min(RATE_WINDOW);
    }

    fn fail(&mut self, fault: BodyFault) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.failed = true;
        Poll::Ready(Some(Err(Box::new(fault))))
    }
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let length = data.len();
                    self.received += length as u64;
                    if self.received > self.bounds.max_bytes {
                        let limit = self.bounds.max_bytes;
                        return self.fail(BodyFault::TooLarge(limit));
                    }
                    self.arrived(length);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => self.fail(BodyFault::Invalid(e.to_string())),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let waiting_since = *self.waiting_since.get_or_insert_with(Instant::now);
                let wake_at = self.wake_at(waiting_since);
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wake_at)));
                if timer.deadline() != wake_at {
                    timer.as_mut().reset(wake_at);
                }
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let fault = if Instant::now() >= self.started + self.bounds.timeout {
                    BodyFault::Timeout(self.bounds.timeout)
                } else {
                    BodyFault::TooSlow(self.bounds.min_bytes_per_sec)
                };
                self.fail(fault)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Bytes of request bodies held in memory at once, across every client.
#[derive(Clone)]
pub struct BufferBudget {
    permits: Arc<Semaphore>,
    units: usize,
    /// Bodies being held now (for the metrics).
    bodies: Arc<AtomicUsize>,
}

/// Bytes reserved from the budget for one body; returned when dropped.
pub struct Reservation {
    permit: Option<OwnedSemaphorePermit>,
    body: Option<Arc<AtomicUsize>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(bodies) = &self.body {
            bodies.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("compactor is holding as many request bytes as it may")]
pub struct Overloaded;

impl BufferBudget {
    /// Semaphore permits are counted in u32: one permit stands for this many bytes.
    pub const UNIT: u64 = 1024;

    pub fn new(max_bytes: u64) -> BufferBudget {
        let units = (max_bytes / Self::UNIT).clamp(1, Semaphore::MAX_PERMITS as u64) as usize;
        BufferBudget {
            permits: Arc::new(Semaphore::new(units)),
            units,
            bodies: Arc::default(),
        }
    }

    pub fn empty_reservation() -> Reservation {
        Reservation {
            permit: None,
            body: None,
        }
    }

    /// A reservation for one body about to be read, counted among the bodies held.
    fn begin(&self) -> Reservation {
        self.bodies.fetch_add(1, Ordering::Relaxed);
        Reservation {
            permit: None,
            body: Some(self.bodies.clone()),
        }
    }

    /// Bodies held, and the bytes reserved for them, now.
    pub fn held(&self) -> (u64, u64) {
        let free = self.permits.available_permits();
        let bytes = self.units.saturating_sub(free) as u64 * Self::UNIT;
        (self.bodies.load(Ordering::Relaxed) as u64, bytes)
    }

    /// Adds room for `bytes` more to `reservation`, or fails at once when the budget is spent.
    pub fn reserve(&self, reservation: &mut Reservation, bytes: u64) -> Result<(), Overloaded> {
        let units = u32::try_from(bytes.div_ceil(Self::UNIT).max(1)).map_err(|_| Overloaded)?;
        let permit = self
            .permits
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| Overloaded)?;
        match &mut reservation.permit {
            Some(held) => held.merge(permit),
            none => *none = Some(permit),
        }
        Ok(())
    }
}

/// Reads a body that must be inspected whole, reserving its bytes from `budget` as they arrive:
/// a client that declares a large body and sends none of it holds none of the budget. The
/// frames are kept as they came and joined once at the end into one buffer of the exact size,
/// so what a body holds while it arrives is what it has sent (a growing buffer would hold up to
/// twice that).
pub async fn read_whole(
    mut body: GuardedBody,
    budget: &BufferBudget,
) -> Result<(Bytes, Reservation), ReadError> {
    use http_body_util::BodyExt;
    let mut reservation = budget.begin();
    let mut frames: Vec<Bytes> = Vec::new();
    let (mut received, mut reserved) = (0u64, 0u64);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| match e.downcast::<BodyFault>() {
            Ok(fault) => ReadError::Fault(*fault),
            Err(other) => ReadError::Fault(BodyFault::Invalid(other.to_string())),
        })?;
        if let Ok(data) = frame.into_data() {
            if data.is_empty() {
                continue;
            }
            received += data.len() as u64;
            if received > reserved {
                let more = received - reserved;
                budget.reserve(&mut reservation, more)?;
                reserved += more.div_ceil(BufferBudget::UNIT) * BufferBudget::UNIT;
            }
            frames.push(data);
        }
    }
    let whole = match frames.len() {
        0 => Bytes::new(),
        1 => frames.swap_remove(0),
        _ => {
            let mut joined = bytes::BytesMut::with_capacity(received as usize);
            for frame in frames.drain(..) {
                joined.extend_from_slice(&frame);
            }
            joined.freeze()
        }
    };
    Ok((whole, reservation))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Fault(#[from] BodyFault),
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
}
