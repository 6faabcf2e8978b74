//! One client connection's life: its place among the connection slots (and its eviction when
//! idle at a cap), what it has in flight, the header bytes it may still send, and the
//! lingering close that keeps an answer from being reset.

use crate::poison::lock;
use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::config::LimitsConfig;
use crate::inbound::Place;

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
    pub(super) registry: Arc<Mutex<Registry>>,
    pub(super) cap: usize,
    pub(super) per_address_cap: usize,
    pub(super) grace: Duration,
    /// The clock every connection's activity is measured from, so their idleness compares.
    pub(super) base: Instant,
    /// Sockets being closed lingeringly (they no longer hold a slot, but hold a descriptor).
    pub(super) lingering: Arc<Semaphore>,
    pub(super) header_bytes: Arc<HeaderBytes>,
}

/// Bytes of request headers read and not yet part of a request, across every connection.
pub(super) struct HeaderBytes {
    pub(super) held: AtomicUsize,
    pub(super) limit: usize,
}

impl HeaderBytes {
    /// Counts `bytes` more; false (and nothing counted) when that would pass the limit.
    pub(super) fn take(&self, bytes: usize) -> bool {
        let before = self.held.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > self.limit {
            self.held.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    pub(super) fn give_back(&self, bytes: usize) {
        if bytes > 0 {
            self.held.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}

#[derive(Default)]
pub(super) struct Registry {
    pub(super) next_id: u64,
    pub(super) open: HashMap<u64, OpenConnection>,
    pub(super) per_address: HashMap<IpAddr, usize>,
}

pub(super) struct OpenConnection {
    pub(super) address: IpAddr,
    pub(super) activity: Arc<Activity>,
    pub(super) evict: Arc<Notify>,
}

/// A connection place held busy by a relay.
pub(super) struct HeldPlace {
    pub(super) _guard: ActivityGuard,
    pub(super) _place: Arc<Slot>,
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
pub(super) struct Slot {
    pub(super) registry: Arc<Mutex<Registry>>,
    pub(super) lingering: Arc<Semaphore>,
    pub(super) id: u64,
    pub(super) activity: Arc<Activity>,
    /// Told when the connection is closed to make room for a new one.
    pub(super) evicted: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.registry).remove(self.id);
    }
}

impl Registry {
    pub(super) fn remove(&mut self, id: u64) {
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
    pub(super) fn evict_idlest(&mut self, address: Option<IpAddr>, grace_until: u64) -> bool {
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
    pub(super) fn admit(&self, address: IpAddr) -> Option<Slot> {
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

/// Requests in flight on one connection, when that last changed, and the header bytes it has
/// read towards its next request.
pub(super) struct Activity {
    pub(super) in_flight: AtomicUsize,
    pub(super) base: Instant,
    /// Nanoseconds after `base` of the last request start or end (or of the connection's start).
    pub(super) changed_at: AtomicU64,
    pub(super) header_bytes: AtomicUsize,
    pub(super) header_budget: Arc<HeaderBytes>,
    /// Whether a request ever began on it (only a client's connection earns the grace).
    pub(super) served: AtomicBool,
}

pub(super) struct ActivityGuard(Arc<Activity>);

impl Activity {
    pub(super) fn new(base: Instant, header_budget: Arc<HeaderBytes>) -> Activity {
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
    pub(super) fn count_header_bytes(&self, bytes: usize) -> bool {
        if !self.header_budget.take(bytes) {
            return false;
        }
        self.header_bytes.fetch_add(bytes, Ordering::AcqRel);
        true
    }

    pub(super) fn touch(&self) {
        let nanos = self.base.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.changed_at.store(nanos, Ordering::Release);
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    pub(super) fn changed_at(&self) -> u64 {
        self.changed_at.load(Ordering::Acquire)
    }

    pub(super) fn has_served(&self) -> bool {
        self.served.load(Ordering::Acquire)
    }

    pub(super) fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.store(true, Ordering::Release);
        self.touch();
        // The headers read so far are this request's now, bounded with it.
        self.header_budget
            .give_back(self.header_bytes.swap(0, Ordering::AcqRel));
        ActivityGuard(self.clone())
    }

    /// Resolves once no request has been in flight for `timeout`.
    pub(super) async fn idle_for(&self, timeout: Duration) {
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
pub(super) struct Tracked<B> {
    pub(super) body: B,
    pub(super) _guard: ActivityGuard,
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

/// The client socket, closed lingeringly when an answer may have left before the request body
/// was read: the write side is shut first so the answer and a FIN reach the client, then what
/// it still sends is read and dropped for a bounded time, so closing does not reset the
/// connection and discard the answer in the client's receive buffer (nginx's lingering close).
/// Lingering sockets are bounded in number (an eighth of the connection cap); past that a
/// socket is closed at once, as before.
pub(super) struct Lingering {
    pub(super) stream: Option<TcpStream>,
    pub(super) linger: Arc<AtomicBool>,
    pub(super) permits: Arc<Semaphore>,
    /// Counts the bytes read while no request is in flight (headers still arriving) against
    /// `limits.max_header_bytes_total`.
    pub(super) activity: Arc<Activity>,
}

/// How long a lingering close reads, at most in all and at most waiting for the next bytes
/// (nginx: `lingering_time` 30 s, `lingering_timeout` 5 s).
pub(super) const LINGER_TOTAL: Duration = Duration::from_secs(10);
pub(super) const LINGER_QUIET: Duration = Duration::from_secs(2);

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

pub(super) async fn linger_then_close(mut stream: TcpStream) {
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
    pub(super) fn with_stream<R>(
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
