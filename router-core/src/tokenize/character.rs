//! `character`, the default tokenizer: the text's own UTF-8 bytes, one byte per "token"
//! (AIBrix's `local_characters.go`). Borrowing the text makes it free.

use std::borrow::Cow;

use super::{TokenizeError, Tokenizer};

/// The text's own UTF-8 bytes.
#[derive(Debug, Default, Clone, Copy)]
pub struct CharacterTokenizer;

impl Tokenizer for CharacterTokenizer {
    fn bytes<'t>(&self, text: &'t str) -> Result<Cow<'t, [u8]>, TokenizeError> {
        Ok(Cow::Borrowed(text.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_the_utf8_text_borrowed() {
        let bytes = CharacterTokenizer.bytes("aé€").unwrap();
        assert!(matches!(bytes, Cow::Borrowed(_)));
        assert_eq!(&*bytes, [b'a', 0xc3, 0xa9, 0xe2, 0x82, 0xac]);
        assert!(CharacterTokenizer.bytes("").unwrap().is_empty());
    }
}
