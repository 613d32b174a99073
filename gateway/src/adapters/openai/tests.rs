use proptest::prelude::*;

use super::*;
use crate::adapters::fixtures::{self, now};

fn grant(retention: bool, train: bool) -> ProviderGrant {
    ProviderGrant {
        epoch: 0,
        retention,
        train,
    }
}

fn body(v: Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn sent(planned: &Planned) -> Value {
    serde_json::from_slice(&planned.body).unwrap()
}

fn code(e: AdapterError) -> &'static str {
    match e {
        AdapterError::Refused(r) => r[0].refusal.code(),
        AdapterError::Invalid(_) => "invalid",
        AdapterError::MissingScope { .. } => "missing_scope",
        AdapterError::UpstreamInvalid(_) => "upstream_invalid",
    }
}

#[test]
fn endpoints_are_classified() {
    let object = |collection, id: &str, item: Option<&str>, access| Endpoint::Object {
        collection,
        id: id.into(),
        item: item.map(Into::into),
        access,
    };
    let cases = [
        (Method::GET, "/v1/models", Endpoint::Models),
        (
            Method::POST,
            "/v1/chat/completions",
            Endpoint::Generate(Generate::Chat),
        ),
        (
            Method::POST,
            "/v1/embeddings",
            Endpoint::Generate(Generate::Embeddings),
        ),
        (
            Method::POST,
            "/v1/responses",
            Endpoint::Generate(Generate::Responses),
        ),
        (
            Method::GET,
            "/v1/responses/r1",
            object(RESPONSES, "r1", None, Access::Read),
        ),
        (
            Method::GET,
            "/v1/responses/r1/input_items",
            object(RESPONSES, "r1", None, Access::Read),
        ),
        (
            Method::DELETE,
            "/v1/responses/r1",
            object(RESPONSES, "r1", None, Access::Delete),
        ),
        (
            Method::POST,
            "/v1/conversations",
            Endpoint::CreateConversation,
        ),
        (
            Method::POST,
            "/v1/conversations/c1/items",
            object(CONVERSATIONS, "c1", None, Access::Write),
        ),
        (
            Method::GET,
            "/v1/conversations/c1/items/i1",
            object(CONVERSATIONS, "c1", Some("i1"), Access::Read),
        ),
        (
            Method::DELETE,
            "/v1/conversations/c1/items/i1",
            object(CONVERSATIONS, "c1", Some("i1"), Access::Delete),
        ),
        (
            Method::DELETE,
            "/v1/conversations/c1",
            object(CONVERSATIONS, "c1", None, Access::Delete),
        ),
        (Method::POST, "/v1/files", Endpoint::UploadFile),
        (Method::GET, "/v1/files", Endpoint::ListFiles),
        (
            Method::GET,
            "/v1/files/f1/content",
            object(FILES, "f1", None, Access::Read),
        ),
        (
            Method::DELETE,
            "/v1/files/f1",
            object(FILES, "f1", None, Access::Delete),
        ),
        (Method::POST, "/v1/fine_tuning/jobs", Endpoint::Refused),
        (Method::POST, "/v1/completions", Endpoint::Refused),
        (Method::GET, "/v1/chat/completions/c1", Endpoint::Refused),
        (Method::POST, "/v1/audio/speech", Endpoint::Refused),
        (Method::PUT, "/v1/responses/r1", Endpoint::Refused),
    ];
    for (method, path, want) in cases {
        assert_eq!(classify(&method, path), want, "{method} {path}");
    }
}

#[test]
fn what_the_provider_would_keep_is_rewritten_unless_consent_covers_it() {
    // A response relies on the provider's default of storing: rewritten without consent.
    let planned = plan(
        Generate::Responses,
        &body(json!({"model": "m", "input": "hi"})),
        &grant(false, false),
    )
    .unwrap();
    assert_eq!(sent(&planned)["store"], json!(false));
    assert!(!planned.stored);
    let planned = plan(
        Generate::Responses,
        &body(json!({"model": "m", "input": "hi"})),
        &grant(true, false),
    )
    .unwrap();
    assert_eq!(
        sent(&planned).get("store"),
        None,
        "left to the provider's default"
    );
    assert!(planned.stored);
    let planned = plan(
        Generate::Chat,
        &body(json!({"model": "m", "messages": [], "store": true})),
        &grant(false, false),
    )
    .unwrap();
    assert_eq!(sent(&planned)["store"], json!(false));
    let planned = plan(
        Generate::Chat,
        &body(json!({"model": "m", "messages": [], "stream": true})),
        &grant(false, false),
    )
    .unwrap();
    assert!(planned.stream && !planned.stored);
    assert_eq!(
        sent(&planned).get("store"),
        None,
        "chat completions are not stored by default"
    );
    let explicit_no = plan(
        Generate::Responses,
        &body(json!({"store": false})),
        &grant(true, false),
    )
    .unwrap();
    assert!(!explicit_no.stored);
}

#[test]
fn what_a_response_builds_on_must_be_checked() {
    let planned = plan(
        Generate::Responses,
        &body(json!({"previous_response_id": "resp_1", "conversation": {"id": "conv_1"}})),
        &grant(true, false),
    )
    .unwrap();
    assert_eq!(
        planned.builds_on,
        vec![
            (RESPONSES, "resp_1".to_owned()),
            (CONVERSATIONS, "conv_1".to_owned())
        ]
    );
    let into_conversation = plan(
        Generate::Responses,
        &body(json!({"conversation": "conv_1"})),
        &grant(false, false),
    );
    assert_eq!(into_conversation.map_err(code), Err("consent_required"));
    for bad in [
        json!({"previous_response_id": 3}),
        json!({"stream": "yes"}),
        json!({"store": 1}),
        json!([1]),
    ] {
        assert_eq!(
            plan(Generate::Responses, &body(bad.clone()), &grant(true, true)).map_err(code),
            Err("invalid"),
            "{bad}"
        );
    }
}

#[test]
fn embeddings_inputs_are_fingerprinted_never_kept() {
    let planned = plan(
        Generate::Embeddings,
        &body(json!({"input": ["likes tea", "lives in Lyon"]})),
        &grant(false, false),
    )
    .unwrap();
    assert_eq!(planned.fingerprints.len(), 2);
    assert_eq!(
        planned.fingerprints[0],
        hex::encode(Sha256::digest(b"likes tea"))
    );
    assert!(
        planned
            .fingerprints
            .iter()
            .all(|f| f.len() == 64 && !f.contains("tea"))
    );
    let single = plan(
        Generate::Embeddings,
        &body(json!({"input": "likes tea"})),
        &grant(false, false),
    )
    .unwrap();
    assert_eq!(single.fingerprints, planned.fingerprints[..1]);
    let tokens = plan(
        Generate::Embeddings,
        &body(json!({"input": [[1, 2, 3]]})),
        &grant(false, false),
    )
    .unwrap();
    assert_eq!(tokens.fingerprints.len(), 1);
    assert_eq!(
        plan(
            Generate::Embeddings,
            &body(json!({"input": []})),
            &grant(false, false)
        )
        .map_err(code),
        Err("invalid")
    );
}

fn stamp(tenant: &str, subject: &str) -> Stamp {
    provider_stamp(
        tenant,
        subject,
        "support",
        "preference",
        &grant(true, false),
        now(),
    )
}

#[test]
fn objects_are_reached_only_by_their_subject() {
    let mine = stamp("acme", "alice");
    let cases = [
        (
            Some(&mine),
            "acme",
            Some("alice"),
            Access::Read,
            true,
            Ok(()),
        ),
        (Some(&mine), "acme", None, Access::Write, true, Ok(())),
        (
            None,
            "acme",
            Some("alice"),
            Access::Read,
            true,
            Err(Refusal::UnstampedItem),
        ),
        (
            Some(&mine),
            "acme",
            Some("bob"),
            Access::Read,
            true,
            Err(Refusal::ScopeViolation),
        ),
        (
            Some(&mine),
            "other",
            Some("alice"),
            Access::Read,
            true,
            Err(Refusal::ScopeViolation),
        ),
        (
            Some(&mine),
            "acme",
            Some("alice"),
            Access::Read,
            false,
            Err(Refusal::SubjectSuppressed),
        ),
        (
            Some(&mine),
            "acme",
            Some("alice"),
            Access::Write,
            false,
            Err(Refusal::SubjectSuppressed),
        ),
        // Removing data is allowed for a suppressed subject.
        (
            Some(&mine),
            "acme",
            Some("alice"),
            Access::Delete,
            false,
            Ok(()),
        ),
    ];
    for (registered, tenant, subject, access, active, want) in cases {
        assert_eq!(
            decide_object(registered, tenant, subject, access, active),
            want,
            "{tenant} {subject:?} {access:?} {active}"
        );
    }
}

#[test]
fn uploads_need_retention_and_fine_tuning_needs_train() {
    assert_eq!(
        decide_upload(Some("fine-tune"), &grant(true, false)),
        Err(Refusal::ConsentRequired)
    );
    assert_eq!(decide_upload(Some("fine-tune"), &grant(true, true)), Ok(()));
    assert_eq!(
        decide_upload(Some("user_data"), &grant(false, true)),
        Err(Refusal::ConsentRequired)
    );
    assert_eq!(
        decide_upload(Some("user_data"), &grant(true, false)),
        Ok(())
    );
}

#[test]
fn the_purpose_of_a_multipart_upload_is_read() {
    let content_type = "multipart/form-data; boundary=XyZ";
    let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\nContent-Type: application/octet-stream\r\n\r\n{\"purpose\": \"x\"}\r\n--XyZ--\r\n";
    assert_eq!(
        multipart_field(content_type, body, "purpose").as_deref(),
        Some("fine-tune")
    );
    assert_eq!(multipart_field(content_type, body, "model"), None);
    assert_eq!(
        multipart_field("multipart/form-data", body, "purpose"),
        None
    );
}

#[test]
fn list_answers_keep_only_what_is_allowed() {
    let answer = json!({"object": "list", "data": [{"id": "f1"}, {"id": "f2"}], "has_more": false});
    let kept = filter_list(answer, |id| id == "f2").unwrap();
    assert_eq!(
        kept,
        json!({"object": "list", "data": [{"id": "f2"}], "has_more": false})
    );
    assert_eq!(
        filter_list(json!({"data": [{"x": 1}]}), |_| true).map_err(code),
        Err("upstream_invalid")
    );
    assert_eq!(answered_id(&json!({"id": "resp_1"})).unwrap(), "resp_1");
    assert!(answer_stored(&json!({"id": "r"})) && !answer_stored(&json!({"store": false})));
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

#[test]
fn a_streamed_objects_id_is_found_in_its_events() {
    let response = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_9\"}}\n\n";
    assert_eq!(streamed_object_id(response).as_deref(), Some("resp_9"));
    let chunk = b"data: {\"id\":\"chatcmpl-3\",\"object\":\"chat.completion.chunk\"}\n\n";
    assert_eq!(streamed_object_id(chunk).as_deref(), Some("chatcmpl-3"));
    assert_eq!(streamed_object_id(b": ping\n\ndata: [DONE]\n\n"), None);
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic_and_are_never_stored_without_consent(body in fixtures::arb_json(vec![
        "model", "input", "messages", "store", "stream", "previous_response_id", "conversation", "id",
    ])) {
        let bytes = body.to_string().into_bytes();
        for kind in [Generate::Chat, Generate::Responses, Generate::Embeddings] {
            if let Ok(planned) = plan(kind, &bytes, &grant(false, false)) {
                prop_assert!(!planned.stored);
                let sent = sent(&planned);
                prop_assert!(sent.get("store") != Some(&json!(true)));
                if kind == Generate::Responses {
                    prop_assert_eq!(sent.get("store"), Some(&json!(false)));
                }
            }
        }
        let mut check = SseCheck::default();
        let _ = check.feed(&bytes);
        let _ = check.finish();
        let _ = multipart_field("multipart/form-data; boundary=x", &bytes, "purpose");
        let _ = filter_list(body, |_| true);
    }
}
