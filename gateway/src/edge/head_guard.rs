//! HTTP/1.1 request heads judged before hyper reads them, so a malformed one is answered in
//! OpenAI JSON rather than with hyper's empty-bodied status line.
//!
//! [`HeadGuard`] sits between hyper (with the half-close wrapper) and the connection's stream.
//! It gives hyper a head only once the head is complete and [`head_limits::parse`] has found
//! it well-formed and within the limits; the bytes after it (the body, as its
//! `content-length` or [`Chunks`] frames it) pass straight through, so the guard always knows
//! where the next pipelined head begins. When a head fails, the guard gives hyper, in its
//! place, a stand-in request ([`STAND_IN`]: `GET`, `connection: close`) and drops everything
//! the client sends after it; the service, told by [`HeadVerdicts`] that this request number
//! is the refused head, answers it with the error (400 `invalid_request_head`, 414
//! `uri_too_long`, 431 `headers_too_large`). So hyper still writes every response, in order
//! after the earlier pipelined ones, then closes; the guard's shutdown then reads and drops
//! what the client still sends for a while (a lingering close), so the client reads the
//! error rather than a reset.
//!
//! What it does not follow: an HTTP/2 connection (the preface as first bytes, or ALPN `h2`),
//! and a connection after a `CONNECT` or `upgrade` request or a chunked body hyper's decoder
//! would refuse: from there on bytes pass unjudged (hyper answers as before, and the service
//! applies [`head_limits::check`]).
//!
//! Cost: the common head arrives whole in one read, straight into hyper's buffer (nothing
//! copied), and is parsed once more than hyper parses it, plus the target's syntax check
//! hyper also makes; in exchange the service no longer walks the parsed header map for the
//! limits, and hyper parses with its default 100 header slots on the stack instead of 400 on
//! the heap. A body costs a subtraction per read (`content-length`) or a few comparisons per
//! chunk line. A head split across reads (a slow client, or the first 24 bytes the protocol
//! sniffer asks for) goes through the guard's own buffer and is parsed again on each read
//! until complete, as hyper does. docs/PERFORMANCE.md has the measured figure.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::edge::chunks::Chunks;
use crate::edge::head_limits::{self, Framing, Head};
use crate::request::error::GatewayError;
use crate::request::parse::{LINGER_BYTES, LINGER_TIME};

/// The request hyper is given in place of a refused head.
pub const STAND_IN: &[u8] = b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n";

/// The HTTP/2 connection preface: a connection that opens with it is not followed.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// hyper's buffer is read into directly when it has at least this much room; a smaller one
/// (the protocol sniffer's 24 bytes) would cut heads into many reads.
const DIRECT_READ: usize = 4096;

/// How much the guard's own buffer reads at once.
const OWN_READ: usize = 16 * 1024;

/// How many discarding reads one poll makes before yielding to other tasks.
const DISCARD_READS: usize = 16;

/// What the guard tells the connection's service: which request stands in for a refused
/// head, and whether heads still reach hyper unjudged.
#[derive(Debug, Default)]
pub struct HeadVerdicts {
    /// The number of the request standing in for the refused head (the connection's first
    /// request is 1); 0 while none is.
    refused: AtomicU64,
    error: Mutex<Option<GatewayError>>,
    unjudged: AtomicBool,
}

impl HeadVerdicts {
    /// The error to answer request `number` of the connection with, if it stands in for a
    /// refused head.
    pub fn refusal(&self, number: u64) -> Option<GatewayError> {
        if self.refused.load(Ordering::Acquire) != number {
            return None;
        }
        self.error.lock().ok()?.take()
    }

    /// Whether this HTTP/1 connection's heads now reach hyper without the guard's judgment.
    pub fn unjudged(&self) -> bool {
        self.unjudged.load(Ordering::Relaxed)
    }
}

/// Where the guard is in the client's byte stream.
#[derive(Debug)]
enum Stage {
    /// The connection's first bytes: the HTTP/2 preface or a first head.
    Start,
    /// A head.
    Head,
    /// So many bytes of a `content-length` body.
    Length(u64),
    /// A chunked body.
    Chunked(Chunks),
    /// Bytes pass unjudged.
    Unjudged,
    /// A head was refused: what follows is dropped.
    Refused,
}

/// A connection's stream, judging each HTTP/1 request head before hyper reads it (see the
/// module docs).
#[derive(Debug)]
pub struct HeadGuard<I> {
    inner: I,
    verdicts: Arc<HeadVerdicts>,
    stage: Stage,
    /// Judged bytes not yet given to hyper.
    judged: BytesMut,
    /// The start of a head not yet complete, held back from hyper.
    held: BytesMut,
    /// How much of `held` was parsed and found incomplete (0: nothing yet).
    parsed: usize,
    /// Heads given to hyper.
    heads: u64,
    /// Set once the guard has shut its side after a refusal; it then lingers until this.
    linger_until: Option<Pin<Box<Sleep>>>,
    /// Bytes dropped after a refusal.
    dropped_bytes: usize,
}

impl<I> HeadGuard<I> {
    /// Guards `inner`; `judge` false lets every byte through (an HTTP/2 connection).
    pub fn new(inner: I, verdicts: Arc<HeadVerdicts>, judge: bool) -> Self {
        if !judge {
            verdicts.unjudged.store(true, Ordering::Relaxed);
        }
        HeadGuard {
            inner,
            verdicts,
            stage: if judge { Stage::Start } else { Stage::Unjudged },
            judged: BytesMut::new(),
            held: BytesMut::new(),
            parsed: 0,
            heads: 0,
            linger_until: None,
            dropped_bytes: 0,
        }
    }

    /// Follows `bytes`, the next bytes of the client's stream after any held head: how many
    /// of them may go to hyper. The rest is an incomplete head (stage `Head` or `Start`) or
    /// follows a refused one (stage `Refused`, with the stand-in queued).
    fn follow(&mut self, bytes: &[u8]) -> usize {
        let mut at = 0;
        while at < bytes.len() {
            let rest = &bytes[at..];
            match &mut self.stage {
                Stage::Start if rest.len() < PREFACE.len() && PREFACE.starts_with(rest) => {
                    return at;
                }
                Stage::Start if rest.starts_with(PREFACE) => {
                    self.unjudge();
                    return bytes.len();
                }
                Stage::Start => self.stage = Stage::Head,
                Stage::Head => match head_limits::parse(rest) {
                    Ok(Head::Partial) => return at,
                    Ok(Head::Complete { len, framing }) => {
                        self.heads += 1;
                        at += len;
                        match framing {
                            Framing::Length(0) => {}
                            Framing::Length(len) => self.stage = Stage::Length(len),
                            Framing::Chunked => self.stage = Stage::Chunked(Chunks::default()),
                            Framing::Upgrade => {
                                self.unjudge();
                                return bytes.len();
                            }
                        }
                    }
                    Err(error) => {
                        self.refuse(error);
                        return at;
                    }
                },
                Stage::Length(left) => {
                    let take = usize::try_from(*left).map_or(rest.len(), |l| l.min(rest.len()));
                    at += take;
                    *left -= take as u64;
                    if *left == 0 {
                        self.stage = Stage::Head;
                    }
                }
                Stage::Chunked(chunks) => match chunks.follow(rest) {
                    Ok(Some(len)) => {
                        at += len;
                        self.stage = Stage::Head;
                    }
                    Ok(None) => return bytes.len(),
                    Err(_) => {
                        tracing::debug!("chunked framing hyper refuses; heads no longer judged");
                        self.unjudge();
                        return bytes.len();
                    }
                },
                Stage::Unjudged => return bytes.len(),
                Stage::Refused => return at,
            }
        }
        at
    }

    fn unjudge(&mut self) {
        self.stage = Stage::Unjudged;
        self.verdicts.unjudged.store(true, Ordering::Relaxed);
    }

    fn refuse(&mut self, error: GatewayError) {
        tracing::debug!(%error, "request head refused");
        let number = self.heads + 1;
        if let Ok(mut slot) = self.verdicts.error.lock() {
            *slot = Some(error);
        }
        self.verdicts.refused.store(number, Ordering::Release);
        self.stage = Stage::Refused;
    }

    /// Moves what [`Self::follow`] judged from the front of `bytes` to the judged queue,
    /// keeps an incomplete head held, and queues the stand-in after a refusal.
    fn sort(&mut self, mut bytes: BytesMut) {
        // As hyper does: a held head is parsed again only when the new bytes may end it, so a
        // client sending its head a byte at a time costs a scan of each byte, not a parse.
        if matches!(self.stage, Stage::Head)
            && self.parsed > 0
            && bytes.len() <= head_limits::MAX_HEAD_LEN
            && !may_end_head(&bytes, self.parsed)
        {
            self.held = bytes;
            return;
        }
        let judged = self.follow(&bytes);
        self.judged.extend_from_slice(&bytes.split_to(judged));
        if let Stage::Refused = self.stage {
            self.judged.extend_from_slice(STAND_IN);
            self.held = BytesMut::new();
        } else {
            self.held = bytes;
        }
        self.parsed = self.held.len();
    }
}

/// Whether the bytes after the first `parsed` (with the three before them) hold a blank
/// line, which a head ends with (hyper's `is_complete_fast`).
fn may_end_head(bytes: &[u8], parsed: usize) -> bool {
    let tail = &bytes[parsed.saturating_sub(3)..];
    tail.windows(2).any(|pair| pair == b"\n\n") || tail.windows(3).any(|trio| trio == b"\n\r\n")
}

impl<I: AsyncRead + Unpin> HeadGuard<I> {
    /// Reads and drops the client's bytes after a refusal, counting them; ready when the
    /// client's input ends.
    fn poll_discard(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut scratch = [0u8; 4096];
        for _ in 0..DISCARD_READS {
            let mut buf = ReadBuf::new(&mut scratch);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut buf))?;
            if buf.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            self.dropped_bytes += buf.filled().len();
        }
        // A client still sending: let other tasks run, then go on.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for HeadGuard<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.judged.is_empty() {
                let n = this.judged.len().min(buf.remaining());
                buf.put_slice(&this.judged[..n]);
                this.judged.advance(n);
                return Poll::Ready(Ok(()));
            }
            match this.stage {
                Stage::Unjudged if this.held.is_empty() => {
                    return Pin::new(&mut this.inner).poll_read(cx, buf);
                }
                Stage::Refused => {
                    ready!(this.poll_discard(cx))?;
                    // The client's input ended.
                    return Poll::Ready(Ok(()));
                }
                _ => {}
            }
            if this.held.is_empty() && buf.remaining() >= DIRECT_READ {
                // Into hyper's buffer: a whole head and its body cost no copy.
                let before = buf.filled().len();
                ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                let read = buf.filled().len() - before;
                if read == 0 {
                    return Poll::Ready(Ok(()));
                }
                let judged = this.follow(&buf.filled()[before..]);
                if judged < read {
                    if !matches!(this.stage, Stage::Refused) {
                        this.held
                            .extend_from_slice(&buf.filled()[before + judged..]);
                        this.parsed = this.held.len();
                    } else {
                        this.judged.extend_from_slice(STAND_IN);
                    }
                    buf.set_filled(before + judged);
                }
                if judged > 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            // Into the guard's own buffer, after the held start of a head.
            let mut bytes = std::mem::take(&mut this.held);
            let start = bytes.len();
            bytes.resize(start + OWN_READ, 0);
            let mut own = ReadBuf::new(&mut bytes[start..]);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut own);
            let read = own.filled().len();
            bytes.truncate(start + read);
            match polled {
                Poll::Pending => {
                    this.held = bytes;
                    return Poll::Pending;
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                // The input ended inside a head: hyper sees the end of input, as when a
                // client leaves before sending a whole head.
                Poll::Ready(Ok(())) if read == 0 => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => this.sort(bytes),
            }
        }
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for HeadGuard<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, data)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    /// After a refusal: shuts the gateway's side, then reads and drops what the client still
    /// sends, for up to `LINGER_TIME` and `LINGER_BYTES`, so closing does not reset a
    /// connection whose client has not read the error yet.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !matches!(this.stage, Stage::Refused) {
            return Pin::new(&mut this.inner).poll_shutdown(cx);
        }
        if this.linger_until.is_none() {
            ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            this.linger_until = Some(Box::pin(tokio::time::sleep_until(
                Instant::now() + LINGER_TIME,
            )));
        }
        let over = this
            .linger_until
            .as_mut()
            .is_some_and(|until| until.as_mut().poll(cx).is_ready());
        match this.poll_discard(cx) {
            // The client closed (or reset): nothing is left to protect.
            Poll::Ready(_) => Poll::Ready(Ok(())),
            Poll::Pending if over || this.dropped_bytes >= LINGER_BYTES => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
#[path = "head_guard_tests.rs"]
mod tests;
