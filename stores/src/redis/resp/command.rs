//! Clients' commands, decoded as their bytes arrive: an array of bulk strings (as every client
//! sends them), never nested, so nothing recurses; each length is checked against the bound as
//! soon as it is read, before its bytes are waited for; and the bytes already decoded are never
//! decoded again, however small the pieces the command comes in. Pure: no I/O.

use bytes::{Buf, BytesMut};

use super::DecodeError;

/// A command's arguments.
pub type Args = Vec<Vec<u8>>;

/// The longest header line a command may have (`*` or `$`, 20 digits, CRLF).
const MAX_HEADER: usize = 24;

/// The fewest bytes one argument takes on the wire (`$0\r\n\r\n`).
const MIN_ARGUMENT: usize = 6;

/// Where the decoder is in the command it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Waiting for `*<count>`.
    Array,
    /// Waiting for the next argument's `$<length>`.
    Header,
    /// Waiting for an argument's bytes and CRLF.
    Bulk(usize),
}

/// Decodes one command after another from a buffer that grows as bytes arrive.
#[derive(Debug)]
pub struct CommandDecoder {
    limit: usize,
    step: Step,
    args: Args,
    /// The arguments still to come.
    left: usize,
    /// The bytes the command has taken so far.
    used: usize,
}

impl CommandDecoder {
    /// A decoder of commands of at most `limit` bytes each.
    pub fn new(limit: usize) -> CommandDecoder {
        CommandDecoder {
            limit,
            step: Step::Array,
            args: Vec::new(),
            left: 0,
            used: 0,
        }
    }

    /// Whether a command has begun and not yet ended.
    pub fn in_command(&self) -> bool {
        self.step != Step::Array || self.used > 0
    }

    /// The next whole command, taken from the front of `buf`; `None` while it is incomplete
    /// (what was decoded of it is kept, and its bytes are gone from `buf`).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Args>, DecodeError> {
        loop {
            match self.step {
                Step::Array => {
                    let Some(count) = self.header(buf, b'*')? else {
                        return Ok(None);
                    };
                    if count == 0 {
                        return Err(DecodeError::Malformed(
                            "a command is an array of one or more bulk strings",
                        ));
                    }
                    if count > self.limit / MIN_ARGUMENT {
                        return Err(DecodeError::TooLarge(self.limit));
                    }
                    self.left = count;
                    self.args = Vec::with_capacity(count.min(64));
                    self.step = Step::Header;
                }
                Step::Header => {
                    let Some(len) = self.header(buf, b'$')? else {
                        return Ok(None);
                    };
                    if len > self.limit || self.used + len + 2 > self.limit {
                        return Err(DecodeError::TooLarge(self.limit));
                    }
                    self.step = Step::Bulk(len);
                }
                Step::Bulk(len) => {
                    if buf.len() < len + 2 {
                        return Ok(None);
                    }
                    if &buf[len..len + 2] != b"\r\n" {
                        return Err(DecodeError::Malformed(
                            "a bulk string is longer than its length",
                        ));
                    }
                    let arg = buf.split_to(len).to_vec();
                    buf.advance(2);
                    self.used += len + 2;
                    self.args.push(arg);
                    self.left -= 1;
                    if self.left > 0 {
                        self.step = Step::Header;
                        continue;
                    }
                    self.step = Step::Array;
                    self.used = 0;
                    return Ok(Some(std::mem::take(&mut self.args)));
                }
            }
        }
    }

    /// A header line `<kind><digits>\r\n` at the front of `buf`, taken from it; `None` while
    /// it is incomplete.
    fn header(&mut self, buf: &mut BytesMut, kind: u8) -> Result<Option<usize>, DecodeError> {
        let Some(&first) = buf.first() else {
            return Ok(None);
        };
        if first != kind {
            return Err(DecodeError::Malformed(match kind {
                b'*' => "a command is an array of bulk strings",
                _ => "a command's arguments are bulk strings",
            }));
        }
        let window = &buf[..buf.len().min(MAX_HEADER)];
        let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
            return match buf.len() >= MAX_HEADER {
                true => Err(DecodeError::Malformed("a length is longer than 20 digits")),
                false => Ok(None),
            };
        };
        let number = parse_length(&buf[1..end])?;
        self.used += end + 2;
        if self.used > self.limit {
            return Err(DecodeError::TooLarge(self.limit));
        }
        buf.advance(end + 2);
        Ok(Some(number))
    }
}

/// A length or count: decimal digits only (no sign, no null), within `usize`.
fn parse_length(digits: &[u8]) -> Result<usize, DecodeError> {
    let not_a_length = DecodeError::Malformed("a length or count is not a number of 0 or more");
    if digits.is_empty() {
        return Err(not_a_length);
    }
    digits.iter().try_fold(0usize, |n, &d| match d {
        b'0'..=b'9' => n
            .checked_mul(10)
            .and_then(|n| n.checked_add(usize::from(d - b'0')))
            .ok_or(DecodeError::Malformed("a length or count is too large")),
        _ => Err(DecodeError::Malformed(
            "a length or count is not a number of 0 or more",
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command of `input` fed in pieces of `piece` bytes, and the error that ended them.
    fn decode_in_pieces(input: &[u8], piece: usize, limit: usize) -> (Vec<Args>, Option<String>) {
        let mut decoder = CommandDecoder::new(limit);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in input.chunks(piece.max(1)) {
            buf.extend_from_slice(chunk);
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Some(args)) => out.push(args),
                    Ok(None) => break,
                    Err(e) => return (out, Some(e.to_string())),
                }
            }
        }
        (out, None)
    }

    #[test]
    fn commands_are_the_same_whatever_pieces_they_arrive_in() {
        let input = b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        let whole = decode_in_pieces(input, input.len(), 1024);
        assert_eq!(
            whole.0,
            [
                vec![b"PING".to_vec()],
                vec![b"SET".to_vec(), b"k".to_vec(), Vec::new()],
                vec![b"GET".to_vec(), b"k".to_vec()]
            ]
        );
        for piece in 1..input.len() {
            assert_eq!(
                decode_in_pieces(input, piece, 1024),
                whole,
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn what_is_no_command_is_refused_at_once() {
        let cases: &[(&[u8], &str)] = &[
            (b"*1\r\n*1\r\n$4\r\nPING\r\n", "arguments are bulk strings"),
            (b"+OK\r\n", "array of bulk strings"),
            (b"PING\r\n", "array of bulk strings"),
            (b"*0\r\n", "one or more"),
            (b"*-1\r\n", "not a number"),
            (b"*1\r\n$-1\r\n", "not a number"),
            (b"*x\r\n", "not a number"),
            (b"*1\r\n$2\r\nabc\r\n", "longer than its length"),
            (b"*123456789012345678901234\r\n", "longer than 20 digits"),
            (b"*99999999999999999999\r\n", "too large"),
        ];
        for (input, want) in cases {
            let (_, error) = decode_in_pieces(input, input.len(), 1024);
            let error = error.unwrap_or_default();
            assert!(error.contains(want), "{input:?}: {error}");
        }
    }

    #[test]
    fn a_command_is_too_large_as_soon_as_a_header_says_so() {
        // Nothing of the argument's bytes has to arrive for the length to be refused.
        let (_, error) = decode_in_pieces(b"*1\r\n$5000\r\n", 64, 1024);
        assert_eq!(
            error.as_deref(),
            Some("the frame is larger than 1024 bytes")
        );
        let (_, error) = decode_in_pieces(b"*1000\r\n", 64, 1024);
        assert_eq!(
            error.as_deref(),
            Some("the frame is larger than 1024 bytes")
        );
        let mut many = b"*100\r\n".to_vec();
        for _ in 0..100 {
            many.extend_from_slice(b"$10\r\n0123456789\r\n");
        }
        let (_, error) = decode_in_pieces(&many, 7, 1024);
        assert_eq!(
            error.as_deref(),
            Some("the frame is larger than 1024 bytes")
        );
    }

    #[test]
    fn twenty_thousand_nested_arrays_are_one_refusal_not_a_recursion() {
        let mut input = b"*1\r\n".repeat(20_000);
        input.extend_from_slice(b"$4\r\nPING\r\n");
        let (commands, error) = decode_in_pieces(&input, 256, 1 << 20);
        assert!(commands.is_empty());
        assert!(error.unwrap_or_default().contains("bulk strings"));
    }

    #[test]
    fn bytes_already_decoded_are_not_kept_waiting() {
        // A 700 KB argument in 256-byte pieces: the buffer holds only what is not yet taken.
        let value = vec![b'x'; 700_000];
        let mut input = format!("*2\r\n$3\r\nSET\r\n${}\r\n", value.len()).into_bytes();
        input.extend_from_slice(&value);
        input.extend_from_slice(b"\r\n");
        let (commands, error) = decode_in_pieces(&input, 256, 1 << 20);
        assert_eq!(error, None);
        assert_eq!(commands.len(), 1);
        assert_eq!(commands[0][1].len(), 700_000);
    }
}
