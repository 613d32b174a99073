//! RESP2 frames over a connection: reading whole frames within a size bound (a client that
//! sends half a command and stops, or a bulk string over the route's limit, never grows a
//! buffer without bound), and the frames Lethe answers with itself.

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::encode::encode;
pub use redis_protocol::resp2::types::OwnedFrame as Frame;
use redis_protocol::resp2::types::Resp2Frame;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Why no frame could be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the frame is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the connection closed in the middle of a frame")]
    Truncated,
    #[error("not RESP: {0}")]
    Malformed(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Frames read one at a time from a byte stream; at most `limit` bytes wait for a frame to
/// complete.
pub struct Frames {
    buf: Vec<u8>,
    limit: usize,
}

impl Frames {
    pub fn new(limit: usize) -> Frames {
        Frames {
            buf: Vec::new(),
            limit,
        }
    }

    /// Whether a whole frame is already waiting (a pipelined command), so that answers to the
    /// ones before it can wait to be written together.
    pub fn has_frame(&self) -> bool {
        matches!(decode(&self.buf), Ok(Some(_)))
    }

    /// The next frame, `None` at a clean end of the stream.
    pub async fn next(
        &mut self,
        io: &mut (impl AsyncRead + Unpin),
    ) -> Result<Option<Frame>, ReadError> {
        loop {
            match decode(&self.buf) {
                Ok(Some((frame, used))) => {
                    if used > self.limit {
                        return Err(ReadError::TooLarge(self.limit));
                    }
                    self.buf.drain(..used);
                    return Ok(Some(frame));
                }
                Ok(None) => {}
                Err(e) => return Err(ReadError::Malformed(e.details().to_owned())),
            }
            if self.buf.len() > self.limit {
                return Err(ReadError::TooLarge(self.limit));
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = io.read(&mut chunk).await?;
            if n == 0 {
                return match self.buf.is_empty() {
                    true => Ok(None),
                    false => Err(ReadError::Truncated),
                };
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A frame as bytes on the wire.
pub fn bytes(frame: &Frame) -> Vec<u8> {
    let mut out = vec![0u8; frame.encode_len(false)];
    match encode(&mut out, frame, false) {
        Ok(n) => out.truncate(n),
        // The buffer is the frame's own length: encoding cannot run out of it.
        Err(_) => out.clear(),
    }
    out
}

pub fn ok() -> Frame {
    Frame::SimpleString(b"OK".to_vec())
}

pub fn error(text: impl Into<String>) -> Frame {
    Frame::Error(text.into().replace(['\r', '\n'], " "))
}

/// A command's arguments, when it is an array of bulk strings (as every client sends them).
pub fn command(frame: Frame) -> Option<Vec<Vec<u8>>> {
    let Frame::Array(parts) = frame else {
        return None;
    };
    parts
        .into_iter()
        .map(|p| match p {
            Frame::BulkString(b) => Some(b),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .filter(|args| !args.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(input: &[u8], limit: usize) -> Vec<Result<Option<Frame>, String>> {
        let mut frames = Frames::new(limit);
        let mut io = input;
        let mut out = Vec::new();
        loop {
            let next = frames.next(&mut io).await.map_err(|e| e.to_string());
            let done = !matches!(next, Ok(Some(_)));
            out.push(next);
            if done {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn pipelined_commands_are_read_one_at_a_time() {
        let got = read_all(b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", 1024).await;
        let commands: Vec<_> = got
            .into_iter()
            .filter_map(|f| f.ok().flatten())
            .map(|f| command(f).unwrap())
            .collect();
        assert_eq!(
            commands,
            [vec![b"PING".to_vec()], vec![b"GET".to_vec(), b"k".to_vec()]]
        );
    }

    #[tokio::test]
    async fn half_a_command_oversized_frames_and_garbage_are_errors() {
        let half = read_all(b"*2\r\n$3\r\nGET\r\n$1", 1024).await;
        assert!(matches!(half.last(), Some(Err(e)) if e.contains("middle")));
        let big = format!("*1\r\n${}\r\n{}\r\n", 5000, "x".repeat(5000));
        let got = read_all(big.as_bytes(), 1024).await;
        assert!(matches!(got.last(), Some(Err(e)) if e.contains("larger than 1024")));
        let garbage = read_all(b"*x\r\n", 1024).await;
        assert!(matches!(garbage.last(), Some(Err(e)) if e.starts_with("not RESP")));
    }

    #[test]
    fn frames_round_trip_and_errors_stay_on_one_line() {
        let frame = Frame::Array(vec![Frame::Integer(3), Frame::Null, ok()]);
        assert_eq!(bytes(&frame), b"*3\r\n:3\r\n$-1\r\n+OK\r\n");
        assert_eq!(bytes(&error("a\r\nb")), b"-a  b\r\n");
    }
}
