//! OTLP/HTTP traces (`opentelemetry-proto` 0.33): an export request decoded (protobuf or
//! OTLP/JSON, gzip or not), each span governed, and what the trace store is sent encoded.
//!
//! A span's subject is the caller's bound subject, or the first of the route's subject
//! attributes the span (else its resource) carries; a span naming another subject than a bound
//! token, or another tenant in a `lethe.tenant` of its own, is refused (counted in OTLP's partial
//! success), never forwarded; so is a span of a subject under erasure. A span whose subject may
//! have it stored (active, `store` consent, a retention rule) keeps its content; any other, and a
//! span with no subject, keeps only what is named structural (models, token counts, status), as
//! scalars, at any depth of its attributes, events and links: content is kept by allow-list, so
//! that operators keep latencies and errors but no personal text however it is nested. A
//! resource keeps only its structural attributes. Subject attributes, and every value equal to
//! the subject's key, are replaced by the subject's reference, and every span carries Lethe's
//! stamp (`lethe.*`), which no client can set or shadow (`lethe`, `user` of `user.id`, ...).
//! Pure: no I/O.

use chrono::{DateTime, SecondsFormat, Utc};
use lethe_policy::{Action, Layer, PolicyView, Refusal, Stamp, WriteFacts, decide_write};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;

mod wire;
pub use wire::{DecodeError, Encoding, answer, decode, encode};

/// The attributes of Lethe's stamp on a span.
pub const TENANT: &str = "lethe.tenant";
pub const SUBJECT_REF: &str = "lethe.subject_ref";
pub const EXPIRES_AT: &str = "lethe.expires_at";
pub const PURPOSE: &str = "lethe.purpose";
/// Why a span's content was withheld (a refusal's code, or `unattributed`).
pub const WITHHELD: &str = "lethe.content_withheld";
/// The span's trace id (lowercase hex), written only in a store's metadata (see
/// [`SpanRules::metadata_prefix`]): a store that names traces its own way is searched by it.
pub const TRACE: &str = "lethe.trace";
/// Every attribute Lethe writes begins so; a client's own are dropped.
const STAMP_PREFIX: &str = "lethe.";
/// The longest text a structural attribute keeps without consent (a model's name, an id).
pub const STRUCTURAL_TEXT: usize = 256;
/// The most values a structural list keeps (`gen_ai.response.finish_reasons`).
const STRUCTURAL_LIST: usize = 16;
/// Under a name's beginning (`llm.token_count.*`), text is kept only as a word this long at
/// most: such names stand for counts and versions, and any number of them could be sent.
const STRUCTURAL_WORD: usize = 64;
/// The most structural attributes one list (a span's, an event's, a link's, a resource's)
/// keeps without consent.
const STRUCTURAL_COUNT: usize = 32;
/// The names OpenTelemetry gives a withheld span's events that are kept as named: any other
/// event keeps its time but not its name, which is the client's text.
const STRUCTURAL_EVENTS: &[&str] = &["exception"];

/// An attribute's (or event's) name, or every name it begins (`llm.input_messages.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name {
    text: String,
    prefix: bool,
}

impl Name {
    /// A name, with at most a final `*`.
    pub fn of(text: &str) -> Result<Name, String> {
        let (stem, prefix) = match text.strip_suffix('*') {
            Some(stem) => (stem, true),
            None => (text, false),
        };
        if stem.is_empty() || stem.contains('*') {
            return Err(format!(
                "{text:?}: a name, or a name's beginning and a final `*`"
            ));
        }
        Ok(Name {
            text: stem.to_owned(),
            prefix,
        })
    }

    pub fn matches(&self, name: &str) -> bool {
        match self.prefix {
            true => name.starts_with(&self.text),
            false => name == self.text,
        }
    }
}

/// What a route does with the spans it is sent.
#[derive(Debug, Clone)]
pub struct SpanRules {
    /// The attributes that name a span's subject (the span's, else its resource's); where
    /// several are present they must agree.
    pub subject_attributes: Vec<String>,
    /// The attributes that carry content (the span's, its events' and links', its resource's).
    pub content_attributes: Vec<Name>,
    /// The events that carry content, by name.
    pub content_events: Vec<Name>,
    /// What a span, its events, links and resource keep without `store` consent.
    pub structural_attributes: Vec<Name>,
    pub purpose: String,
    pub category: String,
    /// Whether subject attributes are replaced by the subject's reference.
    pub pseudonymise: bool,
    /// Whether a span with no subject keeps its content.
    pub keep_unattributed: bool,
    /// Where the trace store keeps span attributes it can search by (LangSmith keeps only
    /// `langsmith.metadata.<key>`, as the run's metadata `<key>`): the stamp is written there too,
    /// as `<prefix>lethe_tenant`, ..., with the span's trace id (`<prefix>lethe_trace`).
    pub metadata_prefix: Option<String>,
}

impl SpanRules {
    /// The name of a stamp attribute (`lethe.x`) in the store's metadata, if it keeps one.
    fn mirrored(&self, key: &str) -> Option<String> {
        let prefix = self.metadata_prefix.as_deref()?;
        Some(format!("{prefix}{}", key.replacen('.', "_", 1)))
    }

    /// Whether an attribute is Lethe's stamp, in either place, or could stand for it or for a
    /// subject attribute where a store nests dotted names (Phoenix keeps `lethe.tenant` as
    /// `{"lethe": {"tenant": ..}}`: a client's `lethe`, `user` or `user.id.x` would shadow them),
    /// or could name a session Lethe did not name under its tenant (`session.id.x`, or a
    /// `session` or `gen_ai` map holding one): a client's own are dropped.
    fn is_stamp(&self, kv: &KeyValue) -> bool {
        let key = kv.key.as_str();
        let below = |path: &str| {
            key.strip_prefix(path)
                .is_some_and(|rest| rest.starts_with('.'))
        };
        let above = |path: &str| {
            path.strip_prefix(key)
                .is_some_and(|rest| rest.starts_with('.'))
        };
        // A map above a session attribute is content like any other unless it holds one.
        let holds_session = |path: &str| {
            path.strip_prefix(key)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|rest| holds(kv.value.as_ref(), rest))
        };
        key.starts_with(STAMP_PREFIX)
            || key == STAMP_PREFIX.trim_end_matches('.')
            || self
                .subject_attributes
                .iter()
                .any(|path| below(path) || above(path))
            || super::ids::SESSIONS
                .iter()
                .any(|path| below(path) || holds_session(path))
            || self
                .metadata_prefix
                .as_deref()
                .and_then(|p| key.strip_prefix(p))
                .is_some_and(|k| k.starts_with("lethe_"))
    }

    /// Whether an attribute is kept where content is not: a structural name holding a scalar
    /// (or a short list of them) of a few characters, a subject attribute (it holds the
    /// reference by then), or Lethe's stamp (a client's own was dropped before).
    fn keeps_without_content(&self, kv: &KeyValue) -> bool {
        if self.subject_attributes.contains(&kv.key) || self.is_stamp(kv) {
            return true;
        }
        let Some(name) = self
            .structural_attributes
            .iter()
            .find(|n| n.matches(&kv.key))
        else {
            return false;
        };
        let scalar = |value: &AnyValue| match &value.value {
            Some(any_value::Value::StringValue(text)) if name.prefix => {
                text.chars().count() <= STRUCTURAL_WORD && !text.contains(char::is_whitespace)
            }
            Some(any_value::Value::StringValue(text)) => text.chars().count() <= STRUCTURAL_TEXT,
            Some(
                any_value::Value::BoolValue(_)
                | any_value::Value::IntValue(_)
                | any_value::Value::DoubleValue(_),
            ) => true,
            _ => false,
        };
        kv.value.as_ref().is_some_and(|value| match &value.value {
            Some(any_value::Value::ArrayValue(list)) => {
                list.values.len() <= STRUCTURAL_LIST && list.values.iter().all(scalar)
            }
            _ => scalar(value),
        })
    }

    /// Whether an attribute of this name carries content.
    fn is_content(&self, key: &str) -> bool {
        self.content_attributes.iter().any(|n| n.matches(key))
    }

    /// Whether an event of this name carries content.
    fn is_content_event(&self, name: &str) -> bool {
        self.content_events.iter().any(|n| n.matches(name))
    }
}

/// Who sends the spans.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub tenant: &'a str,
    /// The subject the caller's token is bound to.
    pub bound: Option<&'a str>,
    /// Whether the tenant's subject keys fold case.
    pub fold: bool,
}

/// A request governed: what to forward, what was refused, and the traces to record.
#[derive(Debug)]
pub struct Governed {
    pub request: ExportTraceServiceRequest,
    pub rejected: i64,
    /// Why the first refused span was refused.
    pub refusal: Option<String>,
    /// The trace (lowercase hex id) of each span kept with its content, and its stamp.
    pub traced: Vec<(String, Stamp)>,
}

/// Every subject the spans of `request` name or are bound to, in their one spelling: the
/// subjects whose policy `govern` needs.
pub fn subjects(
    request: &ExportTraceServiceRequest,
    rules: &SpanRules,
    caller: Caller<'_>,
) -> Vec<String> {
    let mut subjects: std::collections::BTreeSet<String> =
        caller.bound.map(str::to_owned).into_iter().collect();
    for resource_spans in &request.resource_spans {
        let resource = resource_spans.resource.as_ref();
        let named = resource.map(|r| subject_named(&r.attributes, rules, caller));
        let spans = resource_spans.scope_spans.iter().flat_map(|s| &s.spans);
        for subject in spans
            .map(|span| subject_named(all_attributes(span).flatten(), rules, caller))
            .chain(named)
        {
            subjects.extend(subject.ok().flatten());
        }
    }
    subjects.into_iter().collect()
}

/// Governs every span of `request` (see the module's documentation); `refer` gives a subject's
/// reference.
pub fn govern(
    mut request: ExportTraceServiceRequest,
    rules: &SpanRules,
    caller: Caller<'_>,
    view: &impl PolicyView,
    now: DateTime<Utc>,
    refer: &dyn Fn(&str) -> String,
) -> Governed {
    let mut governed = Governed {
        request: ExportTraceServiceRequest::default(),
        rejected: 0,
        refusal: None,
        traced: Vec::new(),
    };
    for mut resource_spans in std::mem::take(&mut request.resource_spans) {
        let mut resource = resource_spans.resource.take().unwrap_or_default();
        let canonical = canonical_keys(&resource.attributes);
        let claimed = unstamped(&mut resource.attributes, rules);
        let named = canonical.and_then(|()| subject_named(&resource.attributes, rules, caller));
        for scope_spans in &mut resource_spans.scope_spans {
            let mut kept = Vec::with_capacity(scope_spans.spans.len());
            for mut span in std::mem::take(&mut scope_spans.spans) {
                let outcome = match (claimed.as_deref(), &named) {
                    (Some(tenant), _) if tenant != caller.tenant => Err(scope_violation()),
                    (_, Err(why)) => Err(why.clone()),
                    (_, Ok(named)) => {
                        one_span(&mut span, named.as_deref(), rules, caller, view, now, refer)
                    }
                };
                match outcome {
                    Ok(traced) => {
                        governed.traced.extend(traced);
                        kept.push(span);
                    }
                    Err(why) => {
                        governed.rejected += 1;
                        governed.refusal.get_or_insert(why);
                    }
                }
            }
            scope_spans.spans = kept;
        }
        resource_spans.scope_spans.retain(|s| !s.spans.is_empty());
        if resource_spans.scope_spans.is_empty() {
            continue;
        }
        // A resource is every one of its spans': it keeps what any of them may keep without
        // content, and the subject it names only where its spans may name it (each kept span
        // of a subject under erasure was refused).
        keep_structural(&mut resource.attributes, rules);
        if let Ok(Some(subject)) = &named {
            let active = view
                .subject(caller.tenant, subject)
                .is_none_or(|p| p.state.is_active());
            if !active {
                resource
                    .attributes
                    .retain(|kv| !rules.subject_attributes.contains(&kv.key));
            } else if rules.pseudonymise {
                pseudonymise(&mut resource.attributes, rules, subject, &refer(subject));
            }
        }
        resource_spans.resource = Some(resource);
        governed.request.resource_spans.push(resource_spans);
    }
    governed
}

fn scope_violation() -> String {
    format!(
        "{}: {}",
        Refusal::ScopeViolation.code(),
        Refusal::ScopeViolation
    )
}

/// Whether every key of `attributes`, at any depth (a map's), reads the same to the trace
/// store as to Lethe: Phoenix strips each dotted segment of a key, so `" user.id"` or
/// `"lethe .tenant"` would land on the subject attribute or the stamp while Lethe saw another
/// name. A key with whitespace or a control character at a segment's ends, or an empty segment,
/// is refused. Iterative: nesting is bounded by the decoder, not this stack.
fn canonical_keys(attributes: &[KeyValue]) -> Result<(), String> {
    let mut pending: Vec<&KeyValue> = attributes.iter().collect();
    while let Some(kv) = pending.pop() {
        let odd = |c: char| c.is_whitespace() || c.is_control();
        let bad = kv.key.split('.').find(|segment| {
            segment.is_empty() || segment.starts_with(odd) || segment.ends_with(odd)
        });
        if bad.is_some() {
            return Err(format!(
                "invalid_request: the attribute key {:?} is not one a trace store reads as sent",
                kv.key
            ));
        }
        let mut values: Vec<&AnyValue> = kv.value.iter().collect();
        while let Some(value) = values.pop() {
            match &value.value {
                Some(any_value::Value::KvlistValue(map)) => pending.extend(&map.values),
                Some(any_value::Value::ArrayValue(list)) => values.extend(&list.values),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Whether a span's ids are ones OTLP allows (a trace id of 16 bytes and a span id of 8, not
/// all zeros; a parent's of 8 or none): only those are made the tenant's own (`ids`), and a
/// store that took another would share it between tenants.
fn valid_ids(span: &Span) -> Result<(), String> {
    let valid = |id: &[u8], len: usize| id.len() == len && id.iter().any(|b| *b != 0);
    let links = span
        .links
        .iter()
        .all(|l| valid(&l.trace_id, 16) && valid(&l.span_id, 8));
    let parent = span.parent_span_id.is_empty() || valid(&span.parent_span_id, 8);
    match valid(&span.trace_id, 16) && valid(&span.span_id, 8) && parent && links {
        true => Ok(()),
        false => Err(
            "invalid_request: a span's trace id is 16 bytes and its span id 8, not all zeros"
                .into(),
        ),
    }
}

/// Every attribute list of a span: its own, its events', its links'.
fn all_attributes(span: &Span) -> impl Iterator<Item = &[KeyValue]> {
    std::iter::once(span.attributes.as_slice())
        .chain(span.events.iter().map(|e| e.attributes.as_slice()))
        .chain(span.links.iter().map(|l| l.attributes.as_slice()))
}

/// Governs one span: its stamp, its content, its subject attributes. `Err`: refused, with why.
fn one_span(
    span: &mut Span,
    resource_subject: Option<&str>,
    rules: &SpanRules,
    caller: Caller<'_>,
    view: &impl PolicyView,
    now: DateTime<Utc>,
    refer: &dyn Fn(&str) -> String,
) -> Result<Option<(String, Stamp)>, String> {
    valid_ids(span)?;
    for attributes in all_attributes(span) {
        canonical_keys(attributes)?;
    }
    if unstamped(&mut span.attributes, rules).is_some_and(|tenant| tenant != caller.tenant) {
        return Err(scope_violation());
    }
    for event in &mut span.events {
        event.attributes.retain(|kv| !rules.is_stamp(kv));
    }
    for link in &mut span.links {
        link.attributes.retain(|kv| !rules.is_stamp(kv));
    }
    // A span is one subject's, wherever it names her: its attributes, its events', its links'.
    let named = subject_named(all_attributes(span).flatten(), rules, caller)?;
    let subject = match (caller.bound, named.as_deref().or(resource_subject)) {
        (Some(bound), Some(named)) if named != bound => return Err(scope_violation()),
        (Some(bound), _) => Some(bound),
        (None, named) => named,
    };
    let mut stamp = vec![text(TENANT, caller.tenant)];
    let Some(subject) = subject else {
        if !rules.keep_unattributed {
            withhold(span, rules);
            stamp.push(text(WITHHELD, "unattributed"));
        }
        apply_stamp(span, stamp, rules);
        return Ok(None);
    };
    let facts = WriteFacts {
        tenant: caller.tenant,
        subject,
        purpose: &rules.purpose,
        category: &rules.category,
        layer: Layer::Raw,
        action: Action::Store,
        authorised_epoch: None,
        requested_expires_at: None,
    };
    let decided = decide_write(view, &facts, now);
    if decided == Err(Refusal::SubjectSuppressed) {
        // A subject under erasure: nothing new may be kept of it, as a late write is refused.
        return Err(format!(
            "{}: {}",
            Refusal::SubjectSuppressed.code(),
            Refusal::SubjectSuppressed
        ));
    }
    stamp.push(text(SUBJECT_REF, &refer(subject)));
    stamp.push(text(PURPOSE, &rules.purpose));
    let traced = match decided {
        Ok(decided) => {
            stamp.push(text(
                EXPIRES_AT,
                &decided
                    .expires_at
                    .to_rfc3339_opts(SecondsFormat::Millis, true),
            ));
            Some((hex::encode(&span.trace_id), decided))
        }
        Err(refusal) => {
            withhold(span, rules);
            stamp.push(text(WITHHELD, refusal.code()));
            None
        }
    };
    if rules.pseudonymise {
        let reference = refer(subject);
        pseudonymise(&mut span.attributes, rules, subject, &reference);
        for event in &mut span.events {
            pseudonymise(&mut event.attributes, rules, subject, &reference);
        }
        for link in &mut span.links {
            pseudonymise(&mut link.attributes, rules, subject, &reference);
        }
    }
    apply_stamp(span, stamp, rules);
    Ok(traced)
}

/// The content each trace of a governed request carries (lowercase hex trace id -> its spans'
/// content attributes' and content events' text, each text once, joined): what derivative
/// lineage reads. OpenInference writes a prompt twice (`input.value` and the messages): it is
/// read once.
pub fn contents(
    request: &ExportTraceServiceRequest,
    rules: &SpanRules,
) -> std::collections::BTreeMap<String, String> {
    let mut contents = std::collections::BTreeMap::<String, String>::new();
    let mut seen = std::collections::HashSet::<(&[u8], &str)>::new();
    for span in request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
    {
        let content = span
            .attributes
            .iter()
            .filter(|kv| rules.is_content(&kv.key));
        let events = span.events.iter().flat_map(|event| {
            let whole = rules.is_content_event(&event.name);
            event
                .attributes
                .iter()
                .filter(move |kv| whole || rules.is_content(&kv.key))
        });
        let links = span
            .links
            .iter()
            .flat_map(|l| &l.attributes)
            .filter(|kv| rules.is_content(&kv.key));
        for t in content.chain(events).chain(links).filter_map(text_of) {
            if t.is_empty() || !seen.insert((&span.trace_id, t)) {
                continue;
            }
            let text = contents.entry(hex::encode(&span.trace_id)).or_default();
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(t);
        }
    }
    contents
}

/// A string attribute's text, borrowed.
fn text_of(kv: &KeyValue) -> Option<&str> {
    match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// Withholds the content of every span of `traces` (lowercase hex ids) kept with it, saying why
/// (`code`): what derives from a subject under erasure is not kept.
pub fn withhold_traces(
    request: &mut ExportTraceServiceRequest,
    traces: &std::collections::BTreeSet<String>,
    rules: &SpanRules,
    code: &str,
) {
    for span in request
        .resource_spans
        .iter_mut()
        .flat_map(|r| &mut r.scope_spans)
        .flat_map(|s| &mut s.spans)
        .filter(|span| traces.contains(&hex::encode(&span.trace_id)))
    {
        if span.attributes.iter().any(|kv| kv.key == EXPIRES_AT) {
            withhold(span, rules);
            let mirrored = rules.mirrored(EXPIRES_AT);
            span.attributes
                .retain(|kv| kv.key != EXPIRES_AT && Some(&kv.key) != mirrored.as_ref());
            span.attributes.push(text(WITHHELD, code));
            if let Some(key) = rules.mirrored(WITHHELD) {
                span.attributes.push(text(&key, code));
            }
        }
    }
}

/// Drops the client's own stamp attributes; answers the tenant one claimed, if any.
fn unstamped(attributes: &mut Vec<KeyValue>, rules: &SpanRules) -> Option<String> {
    let mirrored = rules.mirrored(TENANT);
    let claimed = attributes
        .iter()
        .find(|kv| kv.key == TENANT || Some(&kv.key) == mirrored.as_ref())
        .map(|kv| string_of(kv).unwrap_or_default());
    attributes.retain(|kv| !rules.is_stamp(kv));
    claimed
}

/// Writes Lethe's `stamp` on a span, and in the store's metadata too when it keeps some.
fn apply_stamp(span: &mut Span, stamp: Vec<KeyValue>, rules: &SpanRules) {
    if rules.metadata_prefix.is_some() {
        let mirrored: Vec<KeyValue> = stamp
            .iter()
            .filter_map(|kv| {
                Some(KeyValue {
                    key: rules.mirrored(&kv.key)?,
                    ..kv.clone()
                })
            })
            .collect();
        span.attributes.extend(mirrored);
        if let Some(key) = rules.mirrored(TRACE) {
            span.attributes
                .push(text(&key, &hex::encode(&span.trace_id)));
        }
    }
    span.attributes.extend(stamp);
}

/// The subject the subject attributes name, in its one spelling. `Err` (refused, with why) when
/// one is no subject's name or they name several: a span is one subject's.
fn subject_named<'a>(
    attributes: impl IntoIterator<Item = &'a KeyValue>,
    rules: &SpanRules,
    caller: Caller<'_>,
) -> Result<Option<String>, String> {
    let mut named: Option<String> = None;
    for kv in attributes
        .into_iter()
        .filter(|kv| rules.subject_attributes.contains(&kv.key))
    {
        let text = string_of(kv).unwrap_or_default();
        let subject = lethe_policy::names::canonical_key(&text, caller.fold)
            .map_err(|e| format!("invalid_request: the subject in {} {e}", kv.key))?;
        match &named {
            Some(first) if *first != subject => {
                return Err(format!(
                    "invalid_request: {} names another subject than the other subject attributes",
                    kv.key
                ));
            }
            Some(_) => {}
            None => named = Some(subject.into_owned()),
        }
    }
    Ok(named)
}

/// Replaces every subject attribute's value, and every text equal to the subject's key at any
/// depth of the others (a list's, a map's), by the subject's `reference`.
fn pseudonymise(attributes: &mut [KeyValue], rules: &SpanRules, subject: &str, reference: &str) {
    for kv in attributes.iter_mut() {
        if rules.subject_attributes.contains(&kv.key) {
            kv.value = Some(string_value(reference));
        } else if let Some(value) = kv.value.as_mut() {
            replace_text(value, subject, reference);
        }
    }
}

/// Replaces every text equal to `from` in `value` by `to`. Iterative: a client's nesting is
/// bounded by the decoder, not by this stack.
fn replace_text(value: &mut AnyValue, from: &str, to: &str) {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value.value.as_mut() {
            Some(any_value::Value::StringValue(text)) if text == from => *text = to.to_owned(),
            Some(any_value::Value::ArrayValue(list)) => pending.extend(list.values.iter_mut()),
            Some(any_value::Value::KvlistValue(map)) => {
                pending.extend(map.values.iter_mut().filter_map(|kv| kv.value.as_mut()))
            }
            _ => {}
        }
    }
}

/// Keeps of `attributes` what is kept where content is not (see
/// [`SpanRules::keeps_without_content`]), [`STRUCTURAL_COUNT`] structural ones at most.
fn keep_structural(attributes: &mut Vec<KeyValue>, rules: &SpanRules) {
    let mut structural = 0;
    attributes.retain(|kv| {
        let ours = rules.subject_attributes.contains(&kv.key) || rules.is_stamp(kv);
        let keep = rules.keeps_without_content(kv) && (ours || structural < STRUCTURAL_COUNT);
        structural += usize::from(keep && !ours);
        keep
    });
}

/// Keeps of a span what is kept where content is not, in its attributes, its events' and its
/// links'; the content events go whole. Its name and its other events' names are the client's
/// text: the span is named by its kind, an event by `STRUCTURAL_EVENTS` or as `event`; the
/// status keeps its code but not its message.
fn withhold(span: &mut Span, rules: &SpanRules) {
    keep_structural(&mut span.attributes, rules);
    span.name = kind_name(span.kind).to_owned();
    span.events
        .retain(|event| !rules.is_content_event(&event.name));
    for event in &mut span.events {
        keep_structural(&mut event.attributes, rules);
        if !STRUCTURAL_EVENTS.contains(&event.name.as_str()) {
            event.name = "event".to_owned();
        }
    }
    for link in &mut span.links {
        keep_structural(&mut link.attributes, rules);
    }
    if let Some(status) = span.status.as_mut() {
        status.message.clear();
    }
}

/// A span's kind as OpenTelemetry names it.
fn kind_name(kind: i32) -> &'static str {
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
    match SpanKind::try_from(kind).unwrap_or(SpanKind::Unspecified) {
        SpanKind::Internal => "internal",
        SpanKind::Server => "server",
        SpanKind::Client => "client",
        SpanKind::Producer => "producer",
        SpanKind::Consumer => "consumer",
        SpanKind::Unspecified => "span",
    }
}

/// An attribute's value as text: a string, or a number's digits (ids are often numbers).
fn string_of(kv: &KeyValue) -> Option<String> {
    match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(n) => Some(n.to_string()),
        _ => None,
    }
}

fn string_value(text: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(text.to_owned())),
    }
}

/// Whether `value` is a map that holds the dotted name `path` (`conversation.id`), in nested
/// maps or dotted names, at any depth (each step takes at least one of the path's names).
fn holds(value: Option<&AnyValue>, path: &str) -> bool {
    let Some(any_value::Value::KvlistValue(map)) = value.and_then(|v| v.value.as_ref()) else {
        return false;
    };
    map.values.iter().any(|kv| {
        kv.key == path
            || path
                .strip_prefix(kv.key.as_str())
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|rest| holds(kv.value.as_ref(), rest))
    })
}

/// A text attribute.
pub(crate) fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(string_value(value)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
