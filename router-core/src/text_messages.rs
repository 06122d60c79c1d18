//! A chat body's `messages` read in one pass over bytes serde_json has already validated.
//!
//! The body's parse ([`super::routing_fields_with`]) checks the whole body as JSON once and
//! keeps `messages` as its raw bytes (for the prompt span). Reading the messages with
//! serde again would run its string scanner over the prompt a second time, byte by byte,
//! which was a quarter of the gateway's instructions for a 20 KB prompt. This walk only
//! finds where values end: a string's end with `memchr`'s vectorised search for `"` and
//! `\`, a nested value's by counting brackets outside strings. It checks nothing JSON
//! already guarantees, and keeps serde's rules where they differ from a byte walk: keys
//! are compared unescaped, a second `content` is an error, a non-object element is one.

use std::borrow::Cow;

use super::BodyError;

/// The `content` values of the messages in `array` (a validated JSON array), in order,
/// each as its raw JSON bytes (`None`: the message has no `content`). `Err` names the
/// element that is not an object or holds `content` twice.
pub(super) fn contents(
    array: &str,
    mut each: impl FnMut(usize, Option<&str>),
) -> Result<usize, BodyError> {
    let mut walk = Walk {
        json: array.as_bytes(),
        at: 0,
    };
    walk.expect(b'[')?;
    let mut count = 0;
    if walk.peek() == Some(b']') {
        return Ok(0);
    }
    loop {
        if walk.peek() != Some(b'{') {
            return Err(element(count, "must be an object"));
        }
        let content = walk.content().map_err(|e| match e {
            WalkError::Twice => element(count, "has `content` twice"),
            WalkError::Malformed => malformed(),
        })?;
        each(count, content.map(|span| &array[span]));
        count += 1;
        match walk.next_byte() {
            Some(b',') => {}
            Some(b']') => return Ok(count),
            _ => return Err(malformed()),
        }
    }
}

fn element(i: usize, what: &str) -> BodyError {
    BodyError::field("messages", format!("element {i} {what}"))
}

/// Cannot happen for bytes serde_json validated; the safe answer if it ever did.
fn malformed() -> BodyError {
    BodyError::field("messages", "must be an array")
}

enum WalkError {
    Twice,
    Malformed,
}

/// A position in validated JSON.
struct Walk<'a> {
    json: &'a [u8],
    at: usize,
}

impl Walk<'_> {
    fn peek(&self) -> Option<u8> {
        self.json.get(self.at).copied()
    }

    fn next_byte(&mut self) -> Option<u8> {
        let byte = self.peek();
        self.at += 1;
        self.skip_space();
        byte
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), BodyError> {
        self.skip_space();
        if self.next_byte() == Some(byte) {
            Ok(())
        } else {
            Err(malformed())
        }
    }

    /// Walks one object (at its `{`), returning where its `content` value lies.
    fn content(&mut self) -> Result<Option<std::ops::Range<usize>>, WalkError> {
        self.next_byte();
        let mut content = None;
        if self.peek() == Some(b'}') {
            self.next_byte();
            return Ok(None);
        }
        loop {
            let key = self.string_end().ok_or(WalkError::Malformed)?;
            let is_content = key_is_content(self.json.get(self.at..key).unwrap_or_default());
            self.at = key;
            self.skip_space();
            if self.next_byte() != Some(b':') {
                return Err(WalkError::Malformed);
            }
            let start = self.at;
            self.at = self.value_end().ok_or(WalkError::Malformed)?;
            if is_content {
                if content.is_some() {
                    return Err(WalkError::Twice);
                }
                content = Some(start..self.at);
            }
            self.skip_space();
            match self.next_byte() {
                Some(b',') => {}
                Some(b'}') => return Ok(content),
                _ => return Err(WalkError::Malformed),
            }
        }
    }

    /// Just past the value starting here.
    fn value_end(&self) -> Option<usize> {
        match self.peek()? {
            b'"' => self.string_end(),
            b'{' | b'[' => self.nested_end(),
            // A number, `true`, `false` or `null`: up to the next delimiter.
            _ => {
                Some(
                    self.at
                        + self.json.get(self.at..)?.iter().position(|b| {
                            matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace()
                        })?,
                )
            }
        }
    }

    /// Just past the string whose opening quote is here.
    fn string_end(&self) -> Option<usize> {
        let mut at = self.at + 1;
        loop {
            let found = at + memchr::memchr2(b'"', b'\\', self.json.get(at..)?)?;
            if self.json.get(found) == Some(&b'"') {
                return Some(found + 1);
            }
            // An escape: the byte after the backslash is never the string's end.
            at = found + 2;
        }
    }

    /// Just past the object or array opening here, its strings skipped whole.
    fn nested_end(&self) -> Option<usize> {
        let mut depth = 0usize;
        let mut at = self.at;
        loop {
            match *self.json.get(at)? {
                b'"' => {
                    at = Walk {
                        json: self.json,
                        at,
                    }
                    .string_end()?;
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(at + 1);
                    }
                }
                _ => {}
            }
            at += 1;
        }
    }
}

/// Whether a key (its raw JSON string, quotes included) is `content`, escapes read as
/// serde reads them (`"con\u0074ent"` is `content`).
fn key_is_content(raw: &[u8]) -> bool {
    if memchr::memchr(b'\\', raw).is_none() {
        return raw == b"\"content\"";
    }
    std::str::from_utf8(raw)
        .ok()
        .and_then(|raw| serde_json::from_str::<Cow<'_, str>>(raw).ok())
        .is_some_and(|key| key == "content")
}
