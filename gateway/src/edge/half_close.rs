//! Telling a client that half-closed after its request (`nc -N`, `shutdown(SHUT_WR)`) from
//! one that left, on HTTP/1.1 connections.
//!
//! Both end the client's input, and TCP tells them apart only when something is written: a
//! closed socket answers a write with RST. hyper takes the end of input during an exchange
//! for a hang-up and drops it (a half-closed client gets nothing); with hyper's
//! `half_close` it would wait for the response instead, so a client that really left would
//! be noticed only at its first response byte, after the engine has queued and prefilled a
//! request nobody reads.
//!
//! [`HalfCloseIo`] sits between hyper and the connection's stream (above TLS, so whatever it
//! writes is encrypted like the rest). When the client's input ends while an HTTP/1.1
//! exchange is in flight and its request body has been read, it holds the end back from
//! hyper and, every [`PROBE_INTERVAL`], writes a `100 Continue` interim response if no byte
//! of the response has been written yet (RFC 9110 §15.2: a client must parse 1xx responses
//! it did not ask for), then looks at the socket again. A half-closed client reads the probes
//! and then its response; a client that left answers the probe (or the response head) with
//! RST, the next read fails, and hyper drops the exchange, which releases the replica, the
//! counts and the admission slot. The end is handed to hyper once the response has ended, so
//! the connection closes after it.
//!
//! Never a probe in the middle of a response: only while the latest request has no response
//! byte written since it was dispatched, and hyper's last write went out whole (so nothing of
//! an earlier pipelined response waits in hyper's buffer). Not for HTTP/1.0 (no 1xx there) nor
//! HTTP/2 (whose streams have their own reset): their end of input goes to hyper at once, as
//! a hang-up. A request body the client cut short by ending its input is not held either:
//! once the handler waits for more of it, hyper gets the end and reports the body incomplete.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How often a held end of input is checked, and a probe written while the response has
/// not begun: a client that left is released within about two intervals.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// The probe: an interim response every HTTP/1.1 client skips (`curl`, h11 under `httpx`
/// and `openai`, Python's `http.client`, Go's `net/http` all read past a `100`).
pub const PROBE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// One connection's exchanges as the service sees them, shared with its [`HalfCloseIo`].
#[derive(Debug, Default)]
pub struct Exchanges {
    /// Requests handed to the service.
    dispatched: AtomicU64,
    /// Responses whose body ended or was dropped.
    finished: AtomicU64,
    /// The number of the latest request whose body was read to its end.
    body_read: AtomicU64,
    /// How often a request body was polled with nothing to give (hyper needs more input).
    body_waits: AtomicU64,
    /// Whether the latest request is HTTP/1.1, the only version a probe may be sent to.
    http11: AtomicBool,
    /// Whether the IO holds an end of input back (then the bodies wake it as they move).
    holding: AtomicBool,
    /// The connection task, parked on a held end of input.
    waker: AtomicWaker,
}

impl Exchanges {
    /// Counts a request handed to the service; its watch, for HTTP/1 requests (HTTP/2
    /// streams end on their own resets and are never held).
    pub fn dispatch<B: Body>(self: &Arc<Self>, request: &http::Request<B>) -> Option<Exchange> {
        let number = self.dispatched.fetch_add(1, Ordering::SeqCst) + 1;
        let version = request.version();
        self.http11
            .store(version == http::Version::HTTP_11, Ordering::SeqCst);
        if version == http::Version::HTTP_2 {
            return None;
        }
        if request.body().is_end_stream() {
            self.body_read.store(number, Ordering::SeqCst);
        }
        Some(Exchange {
            exchanges: Arc::clone(self),
            number,
        })
    }

    /// Whether any request has been handed to the service.
    pub fn any_dispatched(&self) -> bool {
        self.dispatched.load(Ordering::SeqCst) > 0
    }

    fn in_flight(&self) -> bool {
        self.finished.load(Ordering::SeqCst) < self.dispatched.load(Ordering::SeqCst)
    }

    fn latest_body_read(&self) -> bool {
        self.body_read.load(Ordering::SeqCst) == self.dispatched.load(Ordering::SeqCst)
    }

    fn wake_if_holding(&self) {
        if self.holding.load(Ordering::SeqCst) {
            self.waker.wake();
        }
    }
}

/// One HTTP/1 request's place among its connection's [`Exchanges`]: wraps its bodies.
#[derive(Debug)]
pub struct Exchange {
    exchanges: Arc<Exchanges>,
    number: u64,
}

impl Exchange {
    /// The request's number on its connection (the first is 1).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The request body, noting when it is read to its end or waits for input.
    pub fn request_body<B>(&self, inner: B) -> WatchedRequest<B> {
        WatchedRequest {
            inner,
            exchanges: Arc::clone(&self.exchanges),
            number: self.number,
        }
    }

    /// The response body, noting when it ends (or is dropped).
    pub fn response_body<B>(self, inner: B) -> WatchedResponse<B> {
        WatchedResponse {
            inner,
            exchanges: Some(self.exchanges),
        }
    }
}

/// A request body that tells its connection's IO when it is read and when it waits.
#[derive(Debug)]
pub struct WatchedRequest<B> {
    inner: B,
    exchanges: Arc<Exchanges>,
    number: u64,
}

impl<B: Body + Unpin> Body for WatchedRequest<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let exchanges = &self.exchanges;
        match &polled {
            Poll::Ready(None) => {
                exchanges.body_read.store(self.number, Ordering::SeqCst);
                exchanges.wake_if_holding();
            }
            Poll::Pending => {
                exchanges.body_waits.fetch_add(1, Ordering::SeqCst);
                exchanges.wake_if_holding();
            }
            Poll::Ready(Some(_)) => {}
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

/// A response body that tells its connection's IO when it has ended.
#[derive(Debug)]
pub struct WatchedResponse<B> {
    inner: B,
    /// Taken when the end is counted, so it is counted once.
    exchanges: Option<Arc<Exchanges>>,
}

impl<B> WatchedResponse<B> {
    fn end(&mut self) {
        if let Some(exchanges) = self.exchanges.take() {
            exchanges.finished.fetch_add(1, Ordering::SeqCst);
            exchanges.wake_if_holding();
        }
    }
}

impl<B> Drop for WatchedResponse<B> {
    fn drop(&mut self) {
        self.end();
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for WatchedResponse<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.end();
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

/// A held end of the client's input.
#[derive(Debug)]
struct Held {
    /// [`Exchanges::body_waits`] when the end was read: a wait after it means the request
    /// body lacks bytes that will never come.
    waits_at_end: u64,
    tick: Pin<Box<Sleep>>,
}

/// A connection's stream, holding back the end of the client's input while an HTTP/1.1
/// exchange is in flight (see the module docs).
#[derive(Debug)]
pub struct HalfCloseIo<I> {
    inner: I,
    exchanges: Arc<Exchanges>,
    held: Option<Held>,
    /// What is left to write of a probe; empty when none is pending.
    probe: &'static [u8],
    /// [`Exchanges::dispatched`] at hyper's last write: a later request has no response
    /// byte written yet.
    written_at: u64,
    /// Whether hyper's last write was refused (its bytes wait in hyper's buffer).
    write_blocked: bool,
}

impl<I> HalfCloseIo<I> {
    pub fn new(inner: I, exchanges: Arc<Exchanges>) -> Self {
        HalfCloseIo {
            inner,
            exchanges,
            held: None,
            probe: &[],
            written_at: 0,
            write_blocked: false,
        }
    }

    fn let_go(&mut self) {
        self.held = None;
        self.exchanges.holding.store(false, Ordering::SeqCst);
    }

    fn note_write(&mut self, result: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Err(_)) = result {
            return;
        }
        self.written_at = self.exchanges.dispatched.load(Ordering::SeqCst);
        self.write_blocked = result.is_pending();
    }

    /// Whether a probe may go out now: the latest request's response has not begun, and
    /// nothing of an earlier one waits in hyper's buffer.
    fn may_probe(&self) -> bool {
        let exchanges = &self.exchanges;
        exchanges.http11.load(Ordering::SeqCst)
            && exchanges.latest_body_read()
            && self.written_at < exchanges.dispatched.load(Ordering::SeqCst)
            && !self.write_blocked
            && self.probe.is_empty()
    }
}

impl<I: AsyncWrite + Unpin> HalfCloseIo<I> {
    /// Writes what is left of a pending probe.
    fn poll_probe(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.probe.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, self.probe))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.probe = &self.probe[n..];
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> HalfCloseIo<I> {
    /// The held end of input: released when the exchange is over or its request body cut
    /// short; meanwhile probed every [`PROBE_INTERVAL`].
    fn poll_held(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.exchanges.waker.register(cx.waker());
        let Some(held) = self.held.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let exchanges = &self.exchanges;
        let cut_short = !exchanges.latest_body_read()
            && exchanges.body_waits.load(Ordering::SeqCst) > held.waits_at_end;
        if !exchanges.in_flight() || cut_short {
            self.let_go();
            return Poll::Ready(Ok(()));
        }
        let mut due = false;
        while held.tick.as_mut().poll(cx).is_ready() {
            held.tick.as_mut().reset(Instant::now() + PROBE_INTERVAL);
            due = true;
        }
        if !due {
            return Poll::Pending;
        }
        if self.may_probe() {
            tracing::trace!("client input ended mid-exchange; probing with 100 Continue");
            self.probe = PROBE;
        }
        if !self.probe.is_empty() && self.poll_probe(cx)?.is_ready() {
            // TLS keeps written bytes until flushed.
            let _ = Pin::new(&mut self.inner).poll_flush(cx)?;
        }
        // A client that left has answered a probe or the response with RST by now (on
        // loopback at once; otherwise by the next tick).
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            // Bytes after the end of input cannot come over TCP; hyper judges them.
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.let_go();
                Poll::Ready(Ok(()))
            }
            _ => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncRead for HalfCloseIo<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.held.is_none() {
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let exchanges = &this.exchanges;
            let at_end = buf.filled().len() == before && buf.remaining() > 0;
            if !at_end || !exchanges.http11.load(Ordering::SeqCst) || !exchanges.in_flight() {
                return Poll::Ready(Ok(()));
            }
            tracing::debug!("client input ended mid-exchange; held until the response ends");
            this.held = Some(Held {
                waits_at_end: exchanges.body_waits.load(Ordering::SeqCst),
                tick: Box::pin(tokio::time::sleep(PROBE_INTERVAL)),
            });
            exchanges.holding.store(true, Ordering::SeqCst);
        }
        this.poll_held(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for HalfCloseIo<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_probe(cx))?;
        let result = Pin::new(&mut this.inner).poll_write(cx, data);
        this.note_write(&result);
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_probe(cx))?;
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, data);
        this.note_write(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_probe(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_probe(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "half_close_tests.rs"]
mod tests;
