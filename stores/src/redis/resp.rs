//! RESP over a connection: clients' commands and Redis' replies read whole within a size bound
//! (a client that sends half a command and stops, or a bulk string over the route's limit,
//! never grows a buffer without bound), in the protocol the client chose with `HELLO` (RESP2,
//! or RESP3); and the replies Lethe makes or rewrites, written in that protocol.

mod command;
mod reply;

use bytes::BytesMut;
use redis_protocol::resp2::types::OwnedFrame as Frame2;
use redis_protocol::resp3::types::{OwnedFrame as Frame3, Resp3Frame};
use tokio::io::{AsyncRead, AsyncReadExt};

pub use command::{Args, CommandDecoder};
pub use reply::ReplyScanner;

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

/// Why bytes are no frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the frame is larger than {0} bytes")]
    TooLarge(usize),
    #[error("not RESP: {0}")]
    Malformed(&'static str),
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
    /// Nothing (or not all of a command) came in time: the reason.
    #[error("{0}")]
    TimedOut(&'static str),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<DecodeError> for ReadError {
    fn from(e: DecodeError) -> ReadError {
        match e {
            DecodeError::TooLarge(limit) => ReadError::TooLarge(limit),
            DecodeError::Malformed(why) => ReadError::Malformed(why.to_owned()),
        }
    }
}

/// How much room a read into a buffer is given at least.
const READ_ROOM: usize = 16 * 1024;

/// Reads more of `io` into `buf`; `Ok(false)` at the end of the stream.
async fn read_more(io: &mut (impl AsyncRead + Unpin), buf: &mut BytesMut) -> std::io::Result<bool> {
    // Into the buffer's spare room: no zeroed chunk per read, no copy.
    buf.reserve(READ_ROOM);
    Ok(io.read_buf(buf).await? > 0)
}

/// A client's commands, read one at a time from its connection; at most `limit` bytes wait for
/// a command to complete, and no command is larger.
pub struct Commands {
    buf: BytesMut,
    decoder: CommandDecoder,
    limit: usize,
}

/// Why a client that was waiting for an answer stopped being waited on.
#[derive(Debug, PartialEq, Eq)]
pub enum Gone {
    /// It closed its side of the connection (or the connection failed).
    Left,
    /// It sent more than a command's worth of bytes behind the command still waiting.
    Overflowed,
}

impl Commands {
    pub fn new(limit: usize) -> Commands {
        Commands {
            buf: BytesMut::new(),
            decoder: CommandDecoder::new(limit),
            limit,
        }
    }

    /// Resolves once the client is gone, reading what it sends meanwhile (a pipeline's next
    /// commands, kept for later): a byte read is not a sign it stays, so the end of the stream
    /// is always seen. More than `limit` bytes behind a waiting command ends the wait too.
    pub async fn until_gone(&mut self, io: &mut (impl AsyncRead + Unpin)) -> Gone {
        loop {
            if self.buf.len() > self.limit {
                return Gone::Overflowed;
            }
            match read_more(io, &mut self.buf).await {
                Ok(true) => {}
                Ok(false) | Err(_) => return Gone::Left,
            }
        }
    }

    /// The next command; `Ok(None)` at a clean end of the stream. Its first byte must come by
    /// `first` (when given), and the rest of it within `whole` of the first: a client that
    /// holds half a command holds a connection and its buffer no longer than that.
    pub async fn next(
        &mut self,
        io: &mut (impl AsyncRead + Unpin),
        first: Option<tokio::time::Instant>,
        whole: std::time::Duration,
    ) -> Result<Option<Args>, ReadError> {
        let mut began = self.partial().then(tokio::time::Instant::now);
        loop {
            if let Some(args) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(args));
            }
            let (deadline, why) = match began {
                Some(at) => (
                    at.checked_add(whole),
                    "a command did not arrive whole in time",
                ),
                None => (first, "no command came in time"),
            };
            let more = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, read_more(io, &mut self.buf))
                    .await
                    .map_err(|_| ReadError::TimedOut(why))??,
                None => read_more(io, &mut self.buf).await?,
            };
            if !more {
                return match self.partial() {
                    false => Ok(None),
                    true => Err(ReadError::Truncated),
                };
            }
            if began.is_none() && self.partial() {
                began = Some(tokio::time::Instant::now());
            }
        }
    }

    /// The next command if the bytes already read hold all of it (a pipeline's next), without
    /// waiting for more; `None` when they do not.
    pub fn buffered(&mut self) -> Option<Result<Args, ReadError>> {
        self.decoder
            .decode(&mut self.buf)
            .map_err(ReadError::from)
            .transpose()
    }

    /// Whether a command has begun to arrive and is not yet whole.
    pub fn partial(&self) -> bool {
        !self.buf.is_empty() || self.decoder.in_command()
    }
}

/// Redis' replies, read one at a time from a connection in the protocol it speaks.
pub struct Replies {
    buf: BytesMut,
    scanner: ReplyScanner,
}

impl Replies {
    pub fn new(limit: usize) -> Replies {
        Replies {
            buf: BytesMut::new(),
            scanner: ReplyScanner::new(limit),
        }
    }

    /// The next reply, in `proto`; `Ok(None)` at a clean end of the stream.
    pub async fn next(
        &mut self,
        io: &mut (impl AsyncRead + Unpin),
        proto: Proto,
    ) -> Result<Option<Reply>, ReadError> {
        loop {
            if let Some(len) = self.scanner.scan(&self.buf, proto)? {
                let frame = self.buf.split_to(len);
                return decode_reply(&frame, proto).map(Some);
            }
            if !read_more(io, &mut self.buf).await? {
                return match self.buf.is_empty() {
                    true => Ok(None),
                    false => Err(ReadError::Truncated),
                };
            }
        }
    }
}

/// A whole frame (its end found by the scanner, so nested at most `reply::MAX_DEPTH` deep)
/// decoded into a reply.
fn decode_reply(frame: &[u8], proto: Proto) -> Result<Reply, ReadError> {
    let malformed = |details: &str| ReadError::Malformed(details.to_owned());
    match proto {
        Proto::Resp2 => match redis_protocol::resp2::decode::decode(frame) {
            Ok(Some((decoded, used))) if used == frame.len() => Ok(Reply::of2(decoded)),
            Ok(_) => Err(malformed("a reply's frame is not one whole frame")),
            Err(e) => Err(malformed(e.details())),
        },
        Proto::Resp3 => match redis_protocol::resp3::decode::complete::decode(frame) {
            Ok(Some((decoded, used))) if used == frame.len() => Ok(Reply::of3(decoded)),
            Ok(_) => Err(malformed("a reply's frame is not one whole frame")),
            Err(e) => Err(malformed(e.details())),
        },
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

    const FOREVER: std::time::Duration = std::time::Duration::MAX;

    #[tokio::test]
    async fn a_client_waited_on_is_seen_to_leave_whatever_it_sent_and_what_it_sent_is_kept() {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut server) = tokio::io::duplex(1024);
        let mut commands = Commands::new(64);
        client.write_all(b"*1\r\n$4\r\nPING\r\n*").await.unwrap();
        drop(client);
        assert_eq!(commands.until_gone(&mut server).await, Gone::Left);
        let next = commands.next(&mut server, None, FOREVER).await;
        assert_eq!(
            next.unwrap(),
            Some(vec![b"PING".to_vec()]),
            "the pipelined command is kept"
        );

        let (mut client, mut server) = tokio::io::duplex(1024);
        let mut commands = Commands::new(64);
        client.write_all(&[b'x'; 100]).await.unwrap();
        assert_eq!(commands.until_gone(&mut server).await, Gone::Overflowed);
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_or_half_a_command_is_given_up_on() {
        use tokio::io::AsyncWriteExt;
        let short = std::time::Duration::from_millis(100);
        let (mut client, mut server) = tokio::io::duplex(1024);
        let mut commands = Commands::new(1024);
        let soon = tokio::time::Instant::now() + short;
        let idle = commands.next(&mut server, Some(soon), FOREVER).await;
        assert!(
            matches!(idle, Err(ReadError::TimedOut("no command came in time"))),
            "{idle:?}"
        );
        client.write_all(b"*2\r\n$3\r\nGET\r\n$1\r").await.unwrap();
        let half = commands.next(&mut server, None, short).await;
        assert!(
            matches!(
                half,
                Err(ReadError::TimedOut(
                    "a command did not arrive whole in time"
                ))
            ),
            "{half:?}"
        );
        // A whole command in time is read whatever the deadlines.
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
        let mut commands = Commands::new(1024);
        let soon = tokio::time::Instant::now() + short;
        let ping = commands.next(&mut server, Some(soon), short).await.unwrap();
        assert_eq!(ping, Some(vec![b"PING".to_vec()]));
    }

    async fn commands(input: &[u8], limit: usize) -> Vec<Result<Vec<Vec<u8>>, String>> {
        let mut frames = Commands::new(limit);
        let mut io = input;
        let mut out = Vec::new();
        loop {
            match frames.next(&mut io, None, FOREVER).await {
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
                Ok(vec![b"PING".to_vec()]),
                Ok(vec![b"GET".to_vec(), b"k".to_vec()])
            ]
        );
        assert_eq!(
            commands(b"+OK\r\n", 1024).await,
            [Err(
                "not RESP: a command is an array of bulk strings".to_owned()
            )]
        );
    }

    #[tokio::test]
    async fn a_pipelines_next_commands_are_taken_from_what_was_read_without_waiting() {
        let mut frames = Commands::new(1024);
        let mut io: &[u8] = b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*2\r\n$3\r\nGET";
        assert!(matches!(
            frames.next(&mut io, None, FOREVER).await,
            Ok(Some(_))
        ));
        let next = frames.buffered();
        assert!(
            matches!(next, Some(Ok(ref args)) if args[1] == b"k"),
            "{next:?}"
        );
        assert!(
            frames.buffered().is_none(),
            "half a command waits for the stream"
        );
        assert!(frames.partial());
        let mut garbage = Commands::new(1024);
        let mut io: &[u8] = b"*1\r\n$4\r\nPING\r\n*x\r\n";
        assert!(matches!(
            garbage.next(&mut io, None, FOREVER).await,
            Ok(Some(_))
        ));
        assert!(matches!(
            garbage.buffered(),
            Some(Err(ReadError::Malformed(_)))
        ));
    }

    #[tokio::test]
    async fn a_subscriptions_push_frames_pass_as_they_were_and_are_arrays_in_resp2() {
        let push: &[u8] = b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n";
        let mut io = push;
        let reply = Replies::new(1024)
            .next(&mut io, Proto::Resp3)
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
        let mut frames = Replies::new(1024);
        let mut io = resp3;
        let mut out = Vec::new();
        for _ in 0..2 {
            let reply = frames.next(&mut io, Proto::Resp3).await.unwrap().unwrap();
            reply.write(Proto::Resp3, &mut out);
        }
        assert_eq!(
            out, resp3,
            "a map, a double, a null and a boolean pass as they were"
        );

        let resp2: &[u8] = b"*3\r\n:3\r\n$-1\r\n$2\r\nab\r\n";
        let mut io = resp2;
        let reply = frames.next(&mut io, Proto::Resp2).await.unwrap().unwrap();
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
