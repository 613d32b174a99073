//! Redis' bytes as Lethe reads them (a server behind a route is not trusted either), in either
//! protocol, cut in pieces: the scanner finds the same frames however they are cut, within the
//! limit and the depth bound, and each frame decodes or is refused without a panic.
#![no_main]

use lethe_stores::redis::resp::{Proto, Replies, ReplyScanner};
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&how, bytes)) = data.split_first() else {
        return;
    };
    let proto = if how & 1 == 0 {
        Proto::Resp2
    } else {
        Proto::Resp3
    };
    let piece = usize::from(how >> 1).max(1);
    assert_eq!(
        frames(bytes, bytes.len().max(1), proto),
        frames(bytes, piece, proto)
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut replies = Replies::new(LIMIT);
        let mut io = bytes;
        while let Ok(Some(_)) = replies.next(&mut io, proto).await {}
    });
});

/// The lengths of the frames `bytes` hold, fed `piece` bytes at a time, and whether they ended
/// in an error.
fn frames(bytes: &[u8], piece: usize, proto: Proto) -> (Vec<usize>, bool) {
    let mut scanner = ReplyScanner::new(LIMIT);
    let mut buf: Vec<u8> = Vec::new();
    let mut lengths = Vec::new();
    for chunk in bytes.chunks(piece) {
        buf.extend_from_slice(chunk);
        loop {
            match scanner.scan(&buf, proto) {
                Ok(Some(len)) => {
                    assert!(len <= LIMIT + 2 && len <= buf.len());
                    buf.drain(..len);
                    lengths.push(len);
                }
                Ok(None) => break,
                Err(_) => return (lengths, true),
            }
        }
    }
    (lengths, false)
}
