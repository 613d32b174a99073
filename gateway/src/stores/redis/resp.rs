//! RESP over a connection: clients' commands and Redis' replies read whole within a size bound
//! (a client that sends half a command and stops, or a bulk string over the route's limit,
//! never grows a buffer without bound), in the protocol the client chose with `HELLO` (RESP2,
//! or RESP3); and the replies Lethe makes or rewrites, written in that protocol.

use redis_protocol::resp2::types::OwnedFrame as Frame2;
use redis_protocol::resp3::types::{OwnedFrame as Frame3, Resp3Frame};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The protocol a client speaks (and Lethe speaks to Redis for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Resp2,
    Resp3,
}

/// A reply as Lethe reads and makes them, in either protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Simple(Vec<u8>),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Reply>),
    /// A map (RESP3), a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// A set (RESP3), an array in RESP2.
    Set(Vec<Reply>),
    /// Out-of-band data (RESP3): a Pub/Sub message or confirmation; an array in RESP2.
    Push(Vec<Reply>),
    /// A RESP3 frame Lethe passes on without reading it (a double, a boolean, ...), encoded.
    Raw(Vec<u8>),
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Simple(b"OK".to_vec())
    }

    /// An error reply, kept on one line.
    pub fn error(text: impl Into<String>) -> Reply {
        Reply::Error(text.into().replace(['\r', '\n'], " "))
    }

    /// The reply on the wire, in `proto`.
    pub fn write(&self, proto: Proto, out: &mut Vec<u8>) {
        let line = |out: &mut Vec<u8>, kind: u8, text: &[u8]| {
            out.push(kind);
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        };
        match self {
            Reply::Simple(s) => line(out, b'+', s),
            Reply::Error(e) => line(out, b'-', e.as_bytes()),
            Reply::Int(n) => line(out, b':', n.to_string().as_bytes()),
            Reply::Bulk(b) => {
                line(out, b'$', b.len().to_string().as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Null if proto == Proto::Resp3 => line(out, b'_', b""),
            Reply::Null => line(out, b'$', b"-1"),
            Reply::Array(items) => {
                line(out, b'*', items.len().to_string().as_bytes());
                items.iter().for_each(|i| i.write(proto, out));
            }
            Reply::Set(items) => {
                let kind = if proto == Proto::Resp3 { b'~' } else { b'*' };
                line(out, kind, items.len().to_string().as_bytes());
                items.iter().for_each(|i| i.write(proto, out));
            }
            Reply::Push(items) => {
                let kind = if proto == Proto::Resp3 { b'>' } else { b'*' };
                line(out, kind, items.len().to_string().as_bytes());
                items.iter().for_each(|i| i.write(proto, out));
            }
            Reply::Map(pairs) if proto == Proto::Resp3 => {
                line(out, b'%', pairs.len().to_string().as_bytes());
                for (k, v) in pairs {
                    k.write(proto, out);
                    v.write(proto, out);
                }
            }
            Reply::Map(pairs) => {
                line(out, b'*', (pairs.len() * 2).to_string().as_bytes());
                for (k, v) in pairs {
                    k.write(proto, out);
                    v.write(proto, out);
                }
            }
            Reply::Raw(bytes) => out.extend_from_slice(bytes),
        }
    }

    fn of2(frame: Frame2) -> Reply {
        match frame {
            Frame2::SimpleString(s) => Reply::Simple(s),
            Frame2::Error(e) => Reply::Error(e),
            Frame2::Integer(n) => Reply::Int(n),
            Frame2::BulkString(b) => Reply::Bulk(b),
            Frame2::Array(items) => Reply::Array(items.into_iter().map(Reply::of2).collect()),
            Frame2::Null => Reply::Null,
        }
    }

    fn of3(frame: Frame3) -> Reply {
        match frame {
            Frame3::SimpleString { data, .. } => Reply::Simple(data),
            Frame3::SimpleError { data, .. } => Reply::Error(data),
            Frame3::BlobError { data, .. } => Reply::Error(String::from_utf8_lossy(&data).into()),
            Frame3::Number { data, .. } => Reply::Int(data),
            Frame3::BlobString { data, .. } => Reply::Bulk(data),
            Frame3::Null => Reply::Null,
            Frame3::Array { data, .. } => Reply::Array(data.into_iter().map(Reply::of3).collect()),
            Frame3::Set { data, .. } => Reply::Set(data.into_iter().map(Reply::of3).collect()),
            Frame3::Push { data, .. } => Reply::Push(data.into_iter().map(Reply::of3).collect()),
            Frame3::Map { data, .. } => Reply::Map(
                data.into_iter()
                    .map(|(k, v)| (Reply::of3(k), Reply::of3(v)))
                    .collect(),
            ),
            other => {
                let mut out = vec![0u8; other.encode_len(false)];
                match redis_protocol::resp3::encode::complete::encode(&mut out, &other, false) {
                    Ok(n) => {
                        out.truncate(n);
                        Reply::Raw(out)
                    }
                    Err(e) => Reply::error(format!("ERR lethe:upstream_invalid {}", e.details())),
                }
            }
        }
    }
}

/// Why nothing could be read.
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

/// A frame decoder: a frame and the bytes it used, nothing yet, or why the bytes are no frame.
type Decode<T> = fn(&[u8]) -> Result<Option<(T, usize)>, String>;

/// A command's arguments, `None` for a frame that is no command.
type Args = Option<Vec<Vec<u8>>>;

fn command(buf: &[u8]) -> Result<Option<(Args, usize)>, String> {
    let decoded = redis_protocol::resp2::decode::decode(buf).map_err(|e| e.details().to_owned())?;
    Ok(decoded.map(|(frame, used)| (args_of(frame), used)))
}

fn reply2(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    let decoded = redis_protocol::resp2::decode::decode(buf).map_err(|e| e.details().to_owned())?;
    Ok(decoded.map(|(frame, used)| (Reply::of2(frame), used)))
}

fn reply3(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    // Redis does not stream its replies: a streamed frame is an error here.
    let decoded =
        redis_protocol::resp3::decode::complete::decode(buf).map_err(|e| e.details().to_owned())?;
    Ok(decoded.map(|(frame, used)| (Reply::of3(frame), used)))
}

/// A command's arguments, when it is an array of bulk strings (as every client sends them).
fn args_of(frame: Frame2) -> Option<Vec<Vec<u8>>> {
    let Frame2::Array(parts) = frame else {
        return None;
    };
    parts
        .into_iter()
        .map(|p| match p {
            Frame2::BulkString(b) => Some(b),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .filter(|args| !args.is_empty())
}

/// Frames read one at a time from a byte stream; at most `limit` bytes wait for a frame to
/// complete, and no frame is larger.
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

    /// The next command: its arguments, or `None` for a frame that is no array of bulk
    /// strings; `Ok(None)` at a clean end of the stream.
    pub async fn command(
        &mut self,
        io: &mut (impl AsyncRead + Unpin),
    ) -> Result<Option<Args>, ReadError> {
        self.next(io, command).await
    }

    /// The next command if the bytes already read hold all of it (a pipeline's next), without
    /// waiting for more; `None` when they do not.
    pub fn buffered_command(&mut self) -> Option<Result<Args, ReadError>> {
        self.take(command).transpose()
    }

    /// The next reply of Redis, in `proto`.
    pub async fn reply(
        &mut self,
        io: &mut (impl AsyncRead + Unpin),
        proto: Proto,
    ) -> Result<Option<Reply>, ReadError> {
        match proto {
            Proto::Resp2 => self.next(io, reply2).await,
            Proto::Resp3 => self.next(io, reply3).await,
        }
    }

    /// The first frame of the bytes read so far, taken from them; `None` while it is incomplete.
    fn take<T>(&mut self, decode: Decode<T>) -> Result<Option<T>, ReadError> {
        match decode(&self.buf).map_err(ReadError::Malformed)? {
            Some((_, used)) if used > self.limit => Err(ReadError::TooLarge(self.limit)),
            Some((frame, used)) => {
                self.buf.drain(..used);
                Ok(Some(frame))
            }
            None if self.buf.len() > self.limit => Err(ReadError::TooLarge(self.limit)),
            None => Ok(None),
        }
    }

    async fn next<T>(
        &mut self,
        io: &mut (impl AsyncRead + Unpin),
        decode: Decode<T>,
    ) -> Result<Option<T>, ReadError> {
        loop {
            if let Some(frame) = self.take(decode)? {
                return Ok(Some(frame));
            }
            // Read into the buffer's spare room: no zeroed chunk per read, no copy.
            self.buf.reserve(16 * 1024);
            let n = io.read_buf(&mut self.buf).await?;
            if n == 0 {
                return match self.buf.is_empty() {
                    true => Ok(None),
                    false => Err(ReadError::Truncated),
                };
            }
        }
    }
}

/// A command as Lethe sends it to Redis.
pub fn command_bytes(args: &[Vec<u8>], out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(out, "*{}\r\n", args.len());
    for arg in args {
        let _ = write!(out, "${}\r\n", arg.len());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn commands(input: &[u8], limit: usize) -> Vec<Result<Option<Vec<Vec<u8>>>, String>> {
        let mut frames = Frames::new(limit);
        let mut io = input;
        let mut out = Vec::new();
        loop {
            match frames.command(&mut io).await {
                Ok(Some(args)) => out.push(Ok(args)),
                Ok(None) => return out,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    return out;
                }
            }
        }
    }

    #[tokio::test]
    async fn pipelined_commands_are_read_one_at_a_time() {
        let got = commands(b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", 1024).await;
        assert_eq!(
            got,
            [
                Ok(Some(vec![b"PING".to_vec()])),
                Ok(Some(vec![b"GET".to_vec(), b"k".to_vec()]))
            ]
        );
        assert_eq!(commands(b"+OK\r\n", 1024).await, [Ok(None)], "no array");
    }

    #[tokio::test]
    async fn a_pipelines_next_commands_are_taken_from_what_was_read_without_waiting() {
        let mut frames = Frames::new(1024);
        let mut io: &[u8] = b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*2\r\n$3\r\nGET";
        assert!(matches!(frames.command(&mut io).await, Ok(Some(Some(_)))));
        let next = frames.buffered_command();
        assert!(
            matches!(next, Some(Ok(Some(ref args))) if args[1] == b"k"),
            "{next:?}"
        );
        assert!(
            frames.buffered_command().is_none(),
            "half a command waits for the stream"
        );
        let mut garbage = Frames::new(1024);
        let mut io: &[u8] = b"*1\r\n$4\r\nPING\r\n*x\r\n";
        assert!(matches!(garbage.command(&mut io).await, Ok(Some(Some(_)))));
        assert!(matches!(
            garbage.buffered_command(),
            Some(Err(ReadError::Malformed(_)))
        ));
    }

    #[tokio::test]
    async fn a_subscriptions_push_frames_pass_as_they_were_and_are_arrays_in_resp2() {
        let push: &[u8] = b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n";
        let mut io = push;
        let reply = Frames::new(1024)
            .reply(&mut io, Proto::Resp3)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(&reply, Reply::Push(items) if items.len() == 3));
        let (mut three, mut two) = (Vec::new(), Vec::new());
        reply.write(Proto::Resp3, &mut three);
        reply.write(Proto::Resp2, &mut two);
        assert_eq!(three, push);
        assert_eq!(two, b"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n");
    }

    #[test]
    fn commands_are_sent_as_arrays_of_bulk_strings() {
        let args = vec![b"SET".to_vec(), b"k".to_vec(), Vec::new()];
        let mut out = Vec::new();
        command_bytes(&args, &mut out);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    #[tokio::test]
    async fn half_a_command_oversized_frames_and_garbage_are_errors() {
        let half = commands(b"*2\r\n$3\r\nGET\r\n$1", 1024).await;
        assert!(matches!(half.last(), Some(Err(e)) if e.contains("middle")));
        let big = format!("*1\r\n${}\r\n{}\r\n", 5000, "x".repeat(5000));
        let got = commands(big.as_bytes(), 1024).await;
        assert!(matches!(got.last(), Some(Err(e)) if e.contains("larger than 1024")));
        let garbage = commands(b"*x\r\n", 1024).await;
        assert!(matches!(garbage.last(), Some(Err(e)) if e.starts_with("not RESP")));
    }

    #[tokio::test]
    async fn replies_of_either_protocol_are_read_and_written_back_alike() {
        let resp3: &[u8] = b"%1\r\n+a\r\n,1.5\r\n*2\r\n_\r\n#t\r\n";
        let mut frames = Frames::new(1024);
        let mut io = resp3;
        let mut out = Vec::new();
        for _ in 0..2 {
            let reply = frames.reply(&mut io, Proto::Resp3).await.unwrap().unwrap();
            reply.write(Proto::Resp3, &mut out);
        }
        assert_eq!(
            out, resp3,
            "a map, a double, a null and a boolean pass as they were"
        );

        let resp2: &[u8] = b"*3\r\n:3\r\n$-1\r\n$2\r\nab\r\n";
        let mut io = resp2;
        let reply = frames.reply(&mut io, Proto::Resp2).await.unwrap().unwrap();
        let mut out = Vec::new();
        reply.write(Proto::Resp2, &mut out);
        assert_eq!(out, resp2);
    }

    #[test]
    fn lethes_own_replies_take_the_clients_protocol_and_stay_on_one_line() {
        let map = Reply::Map(vec![(Reply::Bulk(b"proto".to_vec()), Reply::Int(3))]);
        let (mut two, mut three) = (Vec::new(), Vec::new());
        Reply::Array(vec![map.clone(), Reply::Null, Reply::Set(vec![])])
            .write(Proto::Resp2, &mut two);
        Reply::Array(vec![map, Reply::Null, Reply::Set(vec![])]).write(Proto::Resp3, &mut three);
        assert_eq!(two, b"*3\r\n*2\r\n$5\r\nproto\r\n:3\r\n$-1\r\n*0\r\n");
        assert_eq!(three, b"*3\r\n%1\r\n$5\r\nproto\r\n:3\r\n_\r\n~0\r\n");
        let mut out = Vec::new();
        Reply::error("a\r\nb").write(Proto::Resp2, &mut out);
        assert_eq!(out, b"-a  b\r\n");
    }
}
