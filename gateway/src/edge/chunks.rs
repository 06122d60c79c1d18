//! Where a chunked request body ends, found without decoding it: the head guard's way to the
//! next pipelined head.
//!
//! [`Chunks`] follows the grammar of hyper's chunked decoder byte for byte (size line, optional
//! whitespace and extensions, CRLF, data, CRLF, ..., the zero-size chunk, trailer lines, the
//! final CRLF), with hyper's limits (16 KiB of extensions per body, 16 KiB and 100 lines of
//! trailers), so both agree on the byte the body ends at. Chunk data is skipped, not scanned:
//! the cost is a few comparisons per chunk line. Input hyper's decoder would refuse is
//! [`Unfollowable`]: hyper then fails the body and closes the connection, and the guard stops
//! following it.

/// The most extension bytes a chunked body may carry (hyper's `CHUNKED_EXTENSIONS_LIMIT`).
const EXTENSION_LIMIT: u64 = 16 * 1024;

/// The most trailer bytes a chunked body may carry (hyper's `TRAILER_LIMIT`).
const TRAILER_BYTES_LIMIT: usize = 16 * 1024;

/// The most trailer lines (hyper's default header count).
const TRAILER_LINES_LIMIT: usize = 100;

/// Framing hyper's decoder would refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unfollowable;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Start,
    Size,
    SizeSpace,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// After the zero-size chunk's line: a trailer line or the final CRLF.
    EndCr,
    Trailer,
    TrailerLf,
    EndLf,
}

/// A chunked body's framing, followed as its bytes go by.
#[derive(Debug, Default)]
pub struct Chunks {
    state: State,
    /// The size being read, then what is left of the chunk's data.
    size: u64,
    extension_bytes: u64,
    /// hyper's trailer buffer's length, once it has one.
    trailer_bytes: Option<usize>,
    trailer_lines: usize,
}

impl Chunks {
    /// Follows `bytes`, the body's next bytes: `Some(n)` when the body ends after `n` of
    /// them, `None` when all were taken and it goes on.
    pub fn follow(&mut self, bytes: &[u8]) -> Result<Option<usize>, Unfollowable> {
        let mut at = 0;
        while at < bytes.len() {
            if self.state == State::Data {
                let take = usize::try_from(self.size)
                    .map_or(bytes.len() - at, |size| size.min(bytes.len() - at));
                at += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let byte = bytes[at];
            at += 1;
            if self.step(byte)? {
                return Ok(Some(at));
            }
        }
        Ok(None)
    }

    /// One byte outside chunk data; `true` when it ends the body.
    fn step(&mut self, byte: u8) -> Result<bool, Unfollowable> {
        use State::*;
        self.state = match (self.state, byte) {
            (Start | Size, b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => {
                let digit = char::from(byte).to_digit(16).ok_or(Unfollowable)?;
                self.size = self
                    .size
                    .checked_mul(16)
                    .and_then(|size| size.checked_add(u64::from(digit)))
                    .ok_or(Unfollowable)?;
                Size
            }
            (Size | SizeSpace, b'\t' | b' ') => SizeSpace,
            (Size | SizeSpace, b';') => Extension,
            (Size | SizeSpace | Extension, b'\r') => SizeLf,
            (Extension, b'\n') => return Err(Unfollowable),
            (Extension, _) => {
                self.extension_bytes += 1;
                if self.extension_bytes >= EXTENSION_LIMIT {
                    return Err(Unfollowable);
                }
                Extension
            }
            (SizeLf, b'\n') if self.size == 0 => EndCr,
            (SizeLf, b'\n') => Data,
            (DataCr, b'\r') => DataLf,
            (DataLf, b'\n') => Start,
            (EndCr, b'\r') => {
                if self.trailer_bytes.is_some() {
                    self.keep_trailer_byte()?;
                }
                EndLf
            }
            (EndCr, _) if self.trailer_bytes.is_none() => {
                self.trailer_bytes = Some(1);
                Trailer
            }
            (EndCr | Trailer, _) => {
                self.keep_trailer_byte()?;
                if byte == b'\r' { TrailerLf } else { Trailer }
            }
            (TrailerLf, b'\n') => {
                if self.trailer_lines >= TRAILER_LINES_LIMIT {
                    return Err(Unfollowable);
                }
                self.trailer_lines += 1;
                self.keep_trailer_byte()?;
                EndCr
            }
            (EndLf, b'\n') => {
                if self.trailer_bytes.is_some() {
                    self.keep_trailer_byte()?;
                }
                return Ok(true);
            }
            _ => return Err(Unfollowable),
        };
        Ok(false)
    }

    /// Counts a byte hyper keeps in its trailer buffer, refused at its limit.
    fn keep_trailer_byte(&mut self) -> Result<(), Unfollowable> {
        let bytes = self.trailer_bytes.get_or_insert(0);
        *bytes += 1;
        if *bytes >= TRAILER_BYTES_LIMIT {
            return Err(Unfollowable);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `body` in pieces of `piece` bytes; where the body ended.
    fn end_of(body: &[u8], piece: usize) -> Result<Option<usize>, Unfollowable> {
        let mut chunks = Chunks::default();
        let mut at = 0;
        for part in body.chunks(piece) {
            if let Some(n) = chunks.follow(part)? {
                return Ok(Some(at + n));
            }
            at += part.len();
        }
        Ok(None)
    }

    #[test]
    fn finds_the_end_of_a_chunked_body_however_it_is_split() {
        let body = b"5\r\nhello\r\n1A ; name=value\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\nGET /";
        let trailers = b"3\r\nabc\r\n0\r\nx-trailer: t\r\nx-two: 2\r\n\r\nGET /";
        for piece in [1, 2, 7, 1000] {
            assert_eq!(end_of(body, piece), Ok(Some(body.len() - 5)), "{piece}");
            assert_eq!(
                end_of(trailers, piece),
                Ok(Some(trailers.len() - 5)),
                "{piece}"
            );
            assert_eq!(end_of(&body[..body.len() - 7], piece), Ok(None), "{piece}");
        }
    }

    #[test]
    fn refuses_what_hyper_s_decoder_refuses() {
        for bad in [
            &b"zz\r\n"[..],
            b"5\nhello",
            b"5\r\nhelloX",
            b"5;ext\n",
            b"0\r\nx-trailer: t\rX",
            b"10000000000000000\r\n",
        ] {
            assert_eq!(end_of(bad, 1000), Err(Unfollowable), "{bad:?}");
        }
        let many_trailers = format!("0\r\n{}\r\n", "t: v\r\n".repeat(101));
        assert_eq!(end_of(many_trailers.as_bytes(), 1000), Err(Unfollowable));
        let long_extension = format!("1;{}\r\n", "e".repeat(16 * 1024));
        assert_eq!(end_of(long_extension.as_bytes(), 1000), Err(Unfollowable));
    }
}
