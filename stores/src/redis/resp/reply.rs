//! Where Redis' next reply ends, found as its bytes arrive: the frame is walked once with a
//! stack of the aggregates still open (never recursion), at most `MAX_DEPTH` deep, each line and
//! blob checked against the size bound as soon as its header is read, and only a whole frame is
//! then decoded. Pure: no I/O.

use super::{DecodeError, Proto};

/// The deepest nesting of aggregates a reply may have (Redis' deepest, `COMMAND DOCS`, is 7).
pub const MAX_DEPTH: usize = 32;

/// An aggregate not yet complete.
#[derive(Debug, Clone, Copy)]
struct Open {
    /// Its elements still to come.
    left: usize,
    /// An attribute (RESP3 `|`): it describes the value after it, which counts in its stead.
    attribute: bool,
}

/// Finds the end of one reply after another in a buffer that grows as bytes arrive.
#[derive(Debug)]
pub struct ReplyScanner {
    limit: usize,
    /// The bytes of the current frame walked so far.
    scanned: usize,
    /// Where the search for the current line's CRLF goes on from.
    searched: usize,
    /// A blob's end (after its CRLF) the walk waits for.
    blob_end: Option<usize>,
    open: Vec<Open>,
}

impl ReplyScanner {
    pub fn new(limit: usize) -> ReplyScanner {
        ReplyScanner {
            limit,
            scanned: 0,
            searched: 0,
            blob_end: None,
            open: Vec::new(),
        }
    }

    /// The length of the whole frame at the front of `buf` once it is all there (the scanner
    /// is then ready for the next, which starts where that one ends); `None` while it is not.
    /// `buf` keeps the bytes given before: they are not walked again.
    pub fn scan(&mut self, buf: &[u8], proto: Proto) -> Result<Option<usize>, DecodeError> {
        loop {
            if let Some(end) = self.blob_end {
                if buf.len() < end {
                    return Ok(None);
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return Err(DecodeError::Malformed("a blob is longer than its length"));
                }
                self.blob_end = None;
                self.scanned = end;
                if self.complete() {
                    return Ok(Some(self.finish()));
                }
                continue;
            }
            let from = self.searched.max(self.scanned + 1);
            let Some(at) = buf
                .get(from..)
                .and_then(|rest| rest.windows(2).position(|w| w == b"\r\n"))
            else {
                self.searched = buf.len().saturating_sub(1).max(self.scanned);
                return match buf.len() > self.limit {
                    true => Err(DecodeError::TooLarge(self.limit)),
                    false => Ok(None),
                };
            };
            let line_end = from + at;
            let kind = buf[self.scanned];
            let line = &buf[self.scanned + 1..line_end];
            let next = line_end + 2;
            if next > self.limit {
                return Err(DecodeError::TooLarge(self.limit));
            }
            self.searched = 0;
            if proto == Proto::Resp2 && !matches!(kind, b'+' | b'-' | b':' | b'$' | b'*') {
                return Err(DecodeError::Malformed("not a RESP2 type"));
            }
            match kind {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
                    self.scanned = next;
                    if self.complete() {
                        return Ok(Some(self.finish()));
                    }
                }
                b'$' | b'!' | b'=' => match length(line)? {
                    None if kind == b'$' => {
                        self.scanned = next;
                        if self.complete() {
                            return Ok(Some(self.finish()));
                        }
                    }
                    None => return Err(DecodeError::Malformed("a blob of no length")),
                    Some(len) => {
                        let end = next.checked_add(len).and_then(|e| e.checked_add(2));
                        match end {
                            Some(end) if end <= self.limit => self.blob_end = Some(end),
                            _ => return Err(DecodeError::TooLarge(self.limit)),
                        }
                    }
                },
                b'*' | b'~' | b'>' | b'%' | b'|' => {
                    self.scanned = next;
                    let count = match length(line)? {
                        None if kind == b'*' => {
                            if self.complete() {
                                return Ok(Some(self.finish()));
                            }
                            continue;
                        }
                        None => return Err(DecodeError::Malformed("an aggregate of no length")),
                        Some(n) if matches!(kind, b'%' | b'|') => {
                            n.checked_mul(2).ok_or(DecodeError::TooLarge(self.limit))?
                        }
                        Some(n) => n,
                    };
                    // Every element takes three bytes at least.
                    if count > self.limit / 3 {
                        return Err(DecodeError::TooLarge(self.limit));
                    }
                    if self.open.len() >= MAX_DEPTH {
                        return Err(DecodeError::Malformed("a reply nested too deep"));
                    }
                    let attribute = kind == b'|';
                    match count {
                        0 if attribute => {}
                        0 => {
                            if self.complete() {
                                return Ok(Some(self.finish()));
                            }
                        }
                        left => self.open.push(Open { left, attribute }),
                    }
                }
                _ => return Err(DecodeError::Malformed("not a RESP type Redis sends")),
            }
        }
    }

    /// One element ended: closes the aggregates it completes; `true` when the frame is whole.
    fn complete(&mut self) -> bool {
        while let Some(top) = self.open.last_mut() {
            top.left -= 1;
            if top.left > 0 {
                return false;
            }
            let attribute = top.attribute;
            self.open.pop();
            if attribute {
                // The value it describes is still to come.
                return false;
            }
        }
        true
    }

    /// The frame's length; the scanner starts afresh.
    fn finish(&mut self) -> usize {
        let length = self.scanned;
        self.scanned = 0;
        self.searched = 0;
        length
    }
}

/// A length or count: digits, or `-1` (null), `None`.
fn length(digits: &[u8]) -> Result<Option<usize>, DecodeError> {
    if digits == b"-1" {
        return Ok(None);
    }
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(DecodeError::Malformed("a length is not a number"));
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .map(Some)
        .ok_or(DecodeError::Malformed("a length is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames' lengths found in `input` fed in pieces of `piece` bytes, and the error that
    /// ended them.
    fn frames(input: &[u8], piece: usize, proto: Proto) -> (Vec<usize>, Option<String>) {
        let mut scanner = ReplyScanner::new(1 << 20);
        let mut buf = Vec::new();
        let mut found = Vec::new();
        for chunk in input.chunks(piece.max(1)) {
            buf.extend_from_slice(chunk);
            loop {
                match scanner.scan(&buf, proto) {
                    Ok(Some(len)) => {
                        found.push(len);
                        buf.drain(..len);
                    }
                    Ok(None) => break,
                    Err(e) => return (found, Some(e.to_string())),
                }
            }
        }
        (found, None)
    }

    #[test]
    fn frames_end_where_they_end_whatever_pieces_they_arrive_in() {
        let resp3: &[u8] = b"%1\r\n+a\r\n,1.5\r\n*2\r\n_\r\n#t\r\n|1\r\n+k\r\n:1\r\n$2\r\nab\r\n*-1\r\n~0\r\n>3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n=7\r\ntxt:abc\r\n";
        let whole = frames(resp3, resp3.len(), Proto::Resp3);
        assert_eq!(whole.1, None);
        assert_eq!(whole.0, [14, 11, 20, 5, 4, 32, 13]);
        for piece in 1..resp3.len() {
            assert_eq!(
                frames(resp3, piece, Proto::Resp3),
                whole,
                "pieces of {piece}"
            );
        }
        let resp2: &[u8] = b"*3\r\n:3\r\n$-1\r\n$2\r\nab\r\n-ERR x\r\n";
        assert_eq!(frames(resp2, 3, Proto::Resp2).0, [21, 8]);
    }

    #[test]
    fn deep_long_and_foreign_frames_are_refused() {
        let deep = b"*1\r\n".repeat(20_000);
        let (_, error) = frames(&deep, 4096, Proto::Resp2);
        assert_eq!(error.as_deref(), Some("not RESP: a reply nested too deep"));
        let (_, error) = frames(b"$99999999\r\n", 64, Proto::Resp2);
        assert!(error.unwrap_or_default().contains("larger than"));
        let (_, error) = frames(b"*99999999\r\n", 64, Proto::Resp2);
        assert!(error.unwrap_or_default().contains("larger than"));
        let (_, error) = frames(b"%1\r\n", 64, Proto::Resp2);
        assert!(error.unwrap_or_default().contains("RESP2"));
        let (_, error) = frames(b"$?\r\n", 64, Proto::Resp3);
        assert!(error.unwrap_or_default().contains("not a number"));
        let (_, error) = frames(b"$1\r\nab\r\n", 64, Proto::Resp3);
        assert!(error.unwrap_or_default().contains("longer than its length"));
        let (_, error) = frames(&vec![b'+'; 2 << 20], 4096, Proto::Resp3);
        assert!(error.unwrap_or_default().contains("larger than"));
    }
}
