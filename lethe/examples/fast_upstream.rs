//! A minimal, fast upstream for load tests, so that a load test through Lethe shows Lethe's own
//! overhead. As Chroma it answers every record operation at once with a canned answer; as an
//! OpenAI-compatible provider it answers `/v1/chat/completions` at once, or with `"stream": true`
//! sends 10 events 20 ms apart (so that the time to the first byte can be measured); as an OTLP
//! receiver it takes every `/v1/traces` export; as Azure AI Search it serves the index `bench`
//! (made through Lethe): 5 documents for every search, nothing held under a batch's keys, and
//! every indexing action carried out.
//!
//! `cargo run --release --example fast_upstream -- PORT SUBJECT` (records are stamped for tenant
//! `acme` and SUBJECT, so that Lethe serves them; a read Lethe narrowed to another subject is
//! answered with records stamped for that one).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;

const NOTHING_HELD: &[u8] = br#"{"ids":[],"documents":null,"metadatas":[],"embeddings":null,"uris":null,"data":null,"include":["metadatas"]}"#;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(18080);
    let subject = args.next().unwrap_or_else(|| "load-user".to_owned());
    let (query, get) = answers(&subject);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (query, get, subject) = (query.clone(), get.clone(), subject.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (mut query, mut get) = (query.clone(), get.clone());
                let subject = subject.clone();
                async move {
                    let path = request.uri().path().to_owned();
                    let sent = request
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    if path == "/v1/chat/completions" {
                        return Ok::<_, Infallible>(chat(&sent));
                    }
                    if path == "/v1/traces" {
                        return Ok::<_, Infallible>(traces_taken());
                    }
                    if let Some(rest) = path.strip_prefix("/indexes('bench')") {
                        return Ok::<_, Infallible>(azure_search(rest, &sent, &subject));
                    }
                    if let Some(asked) = asked_subject(&sent).filter(|s| *s != subject) {
                        (query, get) = answers(asked);
                    }
                    let (status, body) = if path.ends_with("/query") {
                        (StatusCode::OK, query)
                    } else if path.ends_with("/get") && sent.windows(6).any(|w| w == b"\"ids\":") {
                        // A get by ids (what Lethe reads before a write): new ids are not held.
                        (StatusCode::OK, Bytes::from_static(NOTHING_HELD))
                    } else if path.ends_with("/get") {
                        (StatusCode::OK, get)
                    } else if path.ends_with("/add") || path.ends_with("/upsert") {
                        (StatusCode::CREATED, Bytes::from_static(b"{}"))
                    } else {
                        (StatusCode::OK, Bytes::from_static(b"{}"))
                    };
                    let mut response = Response::new(Either::Left(Full::new(body)));
                    *response.status_mut() = status;
                    response
                        .headers_mut()
                        .insert("content-type", "application/json".parse().expect("static"));
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// What an OTLP/HTTP receiver answers an export it took whole: an empty
/// `ExportTraceServiceResponse`.
fn traces_taken() -> Answer {
    let mut response = Response::new(Either::Left(Full::new(Bytes::new())));
    response.headers_mut().insert(
        "content-type",
        "application/x-protobuf".parse().expect("static"),
    );
    response
}

/// Azure AI Search's answers for the index `bench`: its definition (with Lethe's stamp fields),
/// 5 documents of `subject` for a search, none for a search by keys (what Lethe reads before a
/// batch), and every action of a batch carried out.
fn azure_search(rest: &str, sent: &[u8], subject: &str) -> Answer {
    let stamp = |name: &str, kind: &str| json!({"name": name, "type": kind, "filterable": true});
    let body = match rest {
        "" => json!({"name": "bench", "fields": [
            {"name": "id", "type": "Edm.String", "key": true, "filterable": true},
            {"name": "text", "type": "Edm.String", "searchable": true},
            stamp("lethe_tenant", "Edm.String"), stamp("lethe_subject", "Edm.String"),
            stamp("lethe_purpose", "Edm.String"), stamp("lethe_category", "Edm.String"),
            stamp("lethe_layer", "Edm.String"), stamp("lethe_expires_at", "Edm.DateTimeOffset"),
            stamp("lethe_epoch", "Edm.Int64")]}),
        "/docs/search.post.search" if sent.windows(10).any(|w| w == b"search.in(") => {
            json!({"value": []})
        }
        "/docs/search.post.search" => {
            let (_, get) = answers(subject);
            let get: serde_json::Value = serde_json::from_slice(&get).unwrap_or_default();
            let docs: Vec<serde_json::Value> = (0..5u8)
                .map(|i| json!({"@search.score": 1.0 - f64::from(i) / 10.0, "id": format!("m{i}"),
                    "text": get["documents"][usize::from(i)], "lethe_subject": subject, "lethe_tenant": "acme",
                    "lethe_purpose": "personalization", "lethe_category": "preference", "lethe_layer": "raw",
                    "lethe_expires_at": "2100-01-01T00:00:00Z", "lethe_epoch": 0}))
                .collect();
            json!({ "value": docs })
        }
        "/docs/search.index" => {
            let batch: serde_json::Value = serde_json::from_slice(sent).unwrap_or_default();
            let results: Vec<serde_json::Value> = batch["value"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| json!({"key": a["id"], "status": true, "errorMessage": null, "statusCode": 201}))
                .collect();
            json!({ "value": results })
        }
        _ => json!({}),
    };
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(body.to_string()))));
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("static"));
    response
}

/// A `query` answer (5 records, nested) and a `get` answer of `subject`'s records.
fn answers(subject: &str) -> (Bytes, Bytes) {
    let stamp = json!({"lethe_subject": subject, "lethe_tenant": "acme", "lethe_owner": format!("acme/{subject}"), "lethe_purpose": "personalization",
        "lethe_category": "preference", "lethe_expires_at": 4_102_444_800i64, "lethe_epoch": 0, "n": 1});
    let ids: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    // Prose, as memories are (derivative lineage fingerprints runs of words).
    let docs: Vec<String> = (0..5)
        .map(|d| {
            (0..60)
                .map(|w| format!("w{}", (d * 7919 + w * 104_729) % 100_000))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let query = json!({"ids": [ids], "documents": [docs], "metadatas": [vec![stamp.clone(); 5]],
        "distances": [[0.1, 0.2, 0.3, 0.4, 0.5]], "embeddings": null, "uris": null, "data": null,
        "include": ["documents", "metadatas", "distances"]});
    let get = json!({"ids": ids, "documents": docs, "metadatas": vec![stamp; 5], "embeddings": null,
        "uris": null, "data": null, "include": ["documents", "metadatas"]});
    (Bytes::from(query.to_string()), Bytes::from(get.to_string()))
}

/// The subject a read Lethe narrowed to one names (its owner key,
/// `"lethe_owner":{"$eq":"acme/..."}`).
fn asked_subject(body: &[u8]) -> Option<&str> {
    const KEY: &[u8] = br#""lethe_owner":{"$eq":"acme/"#;
    let start = body.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let len = body.get(start..)?.iter().position(|&b| b == b'"')?;
    std::str::from_utf8(body.get(start..start + len)?).ok()
}

type Answer = Response<Either<Full<Bytes>, Events>>;

/// A chat completion, whole or as server-sent events.
fn chat(request: &[u8]) -> Answer {
    let chunk = |content: &str| {
        json!({"id": "chatcmpl-load", "object": "chat.completion.chunk", "created": 0, "model": "gpt-test",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
    };
    let streamed = serde_json::from_slice::<serde_json::Value>(request)
        .ok()
        .and_then(|v| v.get("stream")?.as_bool())
        .unwrap_or(false);
    if !streamed {
        let whole = json!({"id": "chatcmpl-load", "object": "chat.completion", "created": 0, "model": "gpt-test",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "echo"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
        let mut response = Response::new(Either::Left(Full::new(Bytes::from(whole.to_string()))));
        response
            .headers_mut()
            .insert("content-type", "application/json".parse().expect("static"));
        return response;
    }
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        for i in 0..10 {
            let event = Bytes::from(format!("data: {}\n\n", chunk(&format!("piece {i} "))));
            if tx.send(event).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let mut response = Response::new(Either::Right(Events(rx)));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().expect("static"));
    response
}

/// Events as they are produced.
struct Events(tokio::sync::mpsc::Receiver<Bytes>);

impl Body for Events {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|e| e.map(|b| Ok(Frame::data(b))))
    }
}
