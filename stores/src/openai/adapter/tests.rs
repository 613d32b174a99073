use proptest::prelude::*;

use super::*;
use crate::data::sse::SseCheck;
use crate::kit::fixtures::{self, code, now};
use serde_json::json;

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
fn objects_are_reached_only_by_their_subject_for_its_purpose_and_epoch() {
    let mine = stamp("acme", "alice");
    let active = SubjectState::default();
    let suppressed = SubjectState {
        status: lethe_policy::SubjectStatus::Suppressed,
        epoch: 1,
    };
    let next_epoch = SubjectState {
        status: lethe_policy::SubjectStatus::Active,
        epoch: 1,
    };
    let decide = |registered: Option<&Stamp>, tenant, subject, purpose, access, owner| {
        decide_object(registered, tenant, subject, purpose, access, owner)
    };
    let cases = [
        (
            Some(&mine),
            "acme",
            "alice",
            "support",
            Access::Read,
            active,
            Ok(()),
        ),
        (
            Some(&mine),
            "acme",
            "alice",
            "support",
            Access::Write,
            active,
            Ok(()),
        ),
        (
            None,
            "acme",
            "alice",
            "support",
            Access::Read,
            active,
            Err(Refusal::UnstampedItem),
        ),
        (
            Some(&mine),
            "acme",
            "bob",
            "support",
            Access::Read,
            active,
            Err(Refusal::ScopeViolation),
        ),
        (
            Some(&mine),
            "other",
            "alice",
            "support",
            Access::Read,
            active,
            Err(Refusal::ScopeViolation),
        ),
        (
            Some(&mine),
            "acme",
            "alice",
            "marketing",
            Access::Read,
            active,
            Err(Refusal::ScopeViolation),
        ),
        (
            Some(&mine),
            "acme",
            "alice",
            "support",
            Access::Read,
            suppressed,
            Err(Refusal::SubjectSuppressed),
        ),
        (
            Some(&mine),
            "acme",
            "alice",
            "support",
            Access::Write,
            next_epoch,
            Err(Refusal::StaleEpoch),
        ),
        // Removing data is allowed for a suppressed subject, whatever the purpose.
        (
            Some(&mine),
            "acme",
            "alice",
            "marketing",
            Access::Delete,
            suppressed,
            Ok(()),
        ),
        (
            Some(&mine),
            "acme",
            "bob",
            "support",
            Access::Delete,
            active,
            Err(Refusal::ScopeViolation),
        ),
    ];
    for (registered, tenant, subject, purpose, access, owner, want) in cases {
        assert_eq!(
            decide(registered, tenant, subject, purpose, access, owner),
            want,
            "{tenant} {subject} {purpose} {access:?} {owner:?}"
        );
    }
}

#[test]
fn uploads_need_retention_and_fine_tuning_needs_train() {
    let one = |p: &str| vec![p.to_owned()];
    let decide = |purposes: Vec<String>, g| decide_upload(&purposes, &g).map_err(code);
    assert_eq!(
        decide(one("fine-tune"), grant(true, false)),
        Err("consent_required")
    );
    assert_eq!(decide(one("fine-tune"), grant(true, true)), Ok(()));
    assert_eq!(
        decide(one("user_data"), grant(false, true)),
        Err("consent_required")
    );
    assert_eq!(decide(one("user_data"), grant(true, false)), Ok(()));
    assert_eq!(
        decide(one("something-new"), grant(true, true)),
        Err("invalid")
    );
    assert_eq!(decide(vec![], grant(true, true)), Err("invalid"));
    assert_eq!(
        decide(
            vec!["assistants".into(), "fine-tune".into()],
            grant(true, false)
        ),
        Err("invalid")
    );
}

#[test]
fn every_purpose_of_a_multipart_upload_is_read() {
    let part = |disposition: &str, value: &str| {
        format!("--XyZ\r\nContent-Disposition: form-data; {disposition}\r\n\r\n{value}\r\n")
    };
    let file = "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\r\n{\"purpose\": \"x\"}\r\n--XyZ--\r\n";
    let body = format!("{}{file}", part("name=\"purpose\"", "fine-tune"));
    let fields =
        |content_type: &str, body: &str| multipart_fields(content_type, body.as_bytes(), "purpose");
    assert_eq!(
        fields("multipart/form-data; boundary=XyZ", &body),
        ["fine-tune"]
    );
    assert_eq!(
        fields("multipart/form-data; Boundary=\"XyZ\"", &body),
        ["fine-tune"]
    );
    assert!(fields("multipart/form-data", &body).is_empty());
    let unquoted = format!("{}{file}", part("name = purpose", "fine-tune"));
    assert_eq!(
        fields("multipart/form-data; boundary=XyZ", &unquoted),
        ["fine-tune"]
    );
    let twice = format!(
        "{}{}{file}",
        part("name=\"purpose\"", "assistants"),
        part("name=\"purpose\"", "fine-tune")
    );
    assert_eq!(
        fields("multipart/form-data; boundary=XyZ", &twice),
        ["assistants", "fine-tune"]
    );
    assert!(
        multipart_fields(
            "multipart/form-data; boundary=XyZ",
            body.as_bytes(),
            "model"
        )
        .is_empty()
    );
}

#[test]
fn objects_named_in_content_must_be_the_subjects_or_are_refused() {
    let planned = plan(
        Generate::Responses,
        &body(json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}],
                     "tools": [{"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["file-2"]}}]})),
        &grant(true, false),
    )
    .unwrap();
    assert_eq!(
        planned.builds_on,
        vec![(FILES, "file-1".to_owned()), (FILES, "file-2".to_owned())]
    );
    for untracked in [
        json!({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}),
        json!({"tools": [{"type": "code_interpreter", "container": "cntr_1"}]}),
        json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
    ] {
        assert_eq!(
            plan(
                Generate::Responses,
                &body(untracked.clone()),
                &grant(true, true)
            )
            .map_err(code),
            Err("invalid"),
            "{untracked}"
        );
    }
    let chat = plan(
        Generate::Chat,
        &body(json!({"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-3"}}]}]})),
        &grant(false, false),
    )
    .unwrap();
    assert_eq!(chat.builds_on, vec![(FILES, "file-3".to_owned())]);
    assert_eq!(
        plan(
            Generate::Embeddings,
            &body(json!({"input": "x", "stream": true})),
            &grant(false, false)
        )
        .map_err(code),
        Err("invalid")
    );
}

#[test]
fn list_answers_keep_only_what_is_allowed() {
    let answer = json!({"object": "list", "data": [{"id": "f1"}, {"id": "f2"}, {"id": "f3"}], "first_id": "f1", "last_id": "f3", "has_more": false});
    let kept = filter_list(answer, |id| id == "f2").unwrap();
    assert_eq!(
        kept,
        json!({"object": "list", "data": [{"id": "f2"}], "first_id": "f2", "last_id": "f2", "has_more": false})
    );
    let none = filter_list(json!({"data": [{"id": "f1"}], "first_id": "f1"}), |_| false).unwrap();
    assert_eq!(none, json!({"data": [], "first_id": null}));
    assert_eq!(
        filter_list(json!({"data": [{"x": 1}]}), |_| true).map_err(code),
        Err("upstream_invalid")
    );
    assert_eq!(answered_id(&json!({"id": "resp_1"})).unwrap(), "resp_1");
    assert!(answer_stored(&json!({"id": "r"})) && !answer_stored(&json!({"store": false})));
    assert_eq!(
        object_path(ITEMS, "conv_1/msg_2").as_deref(),
        Some("/v1/conversations/conv_1/items/msg_2")
    );
    assert_eq!(object_path(EMBEDDED, "ab12"), None);
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
        let _ = multipart_fields("multipart/form-data; boundary=x", &bytes, "purpose");
        let _ = filter_list(body, |_| true);
    }
}

#[test]
fn a_streamed_answer_is_read_event_by_event() {
    let mut chat = StreamedAnswer::default();
    let chunk = |content: &str| {
        format!(
            "data: {}\n\n",
            serde_json::json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}]})
        )
    };
    chat.read(chunk("alice is ").as_bytes());
    chat.read(format!("{}data: [DONE]\n\n", chunk("allergic")).as_bytes());
    assert_eq!(
        chat,
        StreamedAnswer {
            id: Some("chatcmpl-9".into()),
            text: "alice is allergic".into()
        }
    );
    let mut response = StreamedAnswer::default();
    response.read(b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"to peanuts\"}\n\n");
    assert_eq!(response.id.as_deref(), Some("resp_1"));
    assert_eq!(response.text, "to peanuts");
    let mut nothing = StreamedAnswer::default();
    nothing.read(b"data: not json\n\n\xff");
    assert_eq!(nothing, StreamedAnswer::default());
}
