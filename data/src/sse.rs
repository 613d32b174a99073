//! Server-sent events as Lethe relays them (provider and LangGraph streams): each event checked
//! whole before it is passed on, and the error event a cut stream ends with.

use serde_json::{Value, json};

/// The error event Lethe ends a stream with when it cuts it.
pub fn error_event(code: &str, message: &str) -> Vec<u8> {
    let data = json!({ "error": { "code": code, "message": message, "type": "lethe_error" } });
    format!("event: error\ndata: {data}\n\n").into_bytes()
}

/// Checks server-sent events as they pass: every event's `data` must be JSON or `[DONE]`, and
/// the stream UTF-8. Feed it each chunk; it answers the events completed so far (an event split
/// across chunks waits for its end), so only whole, checked events are passed on.
#[derive(Debug, Default)]
pub struct SseCheck {
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no event boundary.
    scanned: usize,
}

/// The largest event Lethe waits for; a provider sending more without an event boundary is cut.
const MAX_EVENT_BYTES: usize = 1024 * 1024;

impl SseCheck {
    pub fn feed(&mut self, chunk: &[u8]) -> Result<bytes::Bytes, String> {
        self.pending.extend_from_slice(chunk);
        let mut complete = Vec::new();
        loop {
            // A boundary may straddle the old and the new bytes: back up by its length.
            let from = self.scanned.saturating_sub(3);
            let Some((at, blank)) = self
                .pending
                .get(from..)
                .and_then(find_event_end)
                .map(|(at, blank)| (at + from, blank))
            else {
                self.scanned = self.pending.len();
                if self.pending.len() > MAX_EVENT_BYTES {
                    return Err("an event larger than 1 MiB".into());
                }
                return Ok(complete.into());
            };
            let length = at;
            self.scanned = 0;
            let event: Vec<u8> = self.pending.drain(..length + blank).collect();
            let text = std::str::from_utf8(&event[..length])
                .map_err(|_| "an event that is not UTF-8".to_owned())?;
            check_event(text)?;
            complete.extend_from_slice(&event);
        }
    }

    /// At the end of the stream: nothing half-sent may be left.
    pub fn finish(&self) -> Result<(), String> {
        if self.pending.iter().all(u8::is_ascii_whitespace) {
            Ok(())
        } else {
            Err("the stream ended in the middle of an event".into())
        }
    }
}

/// Where the first event ends: (its length, the length of the blank line after it).
fn find_event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

fn check_event(text: &str) -> Result<(), String> {
    let mut data = String::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "data" => {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value);
            }
            "event" | "id" | "retry" => {}
            // The field is not named: a provider that does not speak SSE may be sending text.
            _ => return Err("an event with an unknown field".into()),
        }
    }
    if data.is_empty() || data == "[DONE]" || serde_json::from_str::<Value>(&data).is_ok() {
        Ok(())
    } else {
        Err("an event whose data is not JSON".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_without_end_is_cut_at_a_mebibyte() {
        let mut check = SseCheck::default();
        let mut fed = 0;
        let result = loop {
            match check.feed(&[b'x'; 64 * 1024]) {
                Ok(events) => assert!(events.is_empty()),
                Err(e) => break e,
            }
            fed += 1;
            assert!(fed < 100, "never cut");
        };
        assert!(result.contains("1 MiB"));
        // Boundaries that straddle two chunks are found.
        let mut split = SseCheck::default();
        assert_eq!(split.feed(b"data: {}\n").unwrap(), "");
        assert_eq!(split.feed(b"\ndata: {}\r\n\r").unwrap(), "data: {}\n\n");
        assert_eq!(split.feed(b"\n").unwrap(), "data: {}\r\n\r\n");
    }

    #[test]
    fn server_sent_events_are_checked_as_they_pass() {
        let mut check = SseCheck::default();
        assert_eq!(
            check.feed(b"data: {\"a\":").unwrap(),
            "",
            "an event split across chunks waits"
        );
        assert_eq!(
            check
                .feed(b" 1}\n\n: keep-alive\n\nevent: response.created\ndata: {}\n\ndata: {")
                .unwrap(),
            "data: {\"a\": 1}\n\n: keep-alive\n\nevent: response.created\ndata: {}\n\n"
        );
        assert_eq!(
            check.feed(b"}\n\ndata: [DONE]\r\n\r\n").unwrap(),
            "data: {}\n\ndata: [DONE]\r\n\r\n"
        );
        assert_eq!(check.finish(), Ok(()));
        let mut half = SseCheck::default();
        half.feed(b"data: {\"a\"").unwrap();
        assert!(half.finish().is_err());
        for bad in [
            &b"data: not json\n\n"[..],
            b"garbage line\n\n",
            b"data: \xff\xfe\n\n",
        ] {
            assert!(
                SseCheck::default().feed(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let event = String::from_utf8(error_event("subject_suppressed", "cut")).unwrap();
        assert!(SseCheck::default().feed(event.as_bytes()).is_ok());
        assert!(event.starts_with("event: error\ndata: {"));
    }
}
