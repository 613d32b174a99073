//! A client's bytes on the Redis listener, before or after `AUTH`, cut in pieces of the size the
//! first byte says: the commands decoded are the same however the bytes are cut (the decoder
//! keeps its place, never decodes a byte twice), none is over the limit, and nothing panics or
//! recurses.
#![no_main]

use bytes::BytesMut;
use lethe_stores::redis::resp::CommandDecoder;
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&piece, bytes)) = data.split_first() else {
        return;
    };
    let whole = decode(bytes, bytes.len().max(1));
    let cut = decode(bytes, usize::from(piece).max(1));
    assert_eq!(whole, cut);
});

/// The commands `bytes` hold, fed `piece` bytes at a time, and whether they ended in an error.
fn decode(bytes: &[u8], piece: usize) -> (Vec<Vec<Vec<u8>>>, bool) {
    let mut decoder = CommandDecoder::new(LIMIT);
    let mut buf = BytesMut::new();
    let mut commands = Vec::new();
    for chunk in bytes.chunks(piece) {
        buf.extend_from_slice(chunk);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(args)) => {
                    assert!(args.iter().map(Vec::len).sum::<usize>() <= LIMIT);
                    commands.push(args);
                }
                Ok(None) => break,
                Err(_) => return (commands, true),
            }
        }
    }
    (commands, false)
}
