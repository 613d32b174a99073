//! A model-based test of the Redis route: random command sequences (strings, lists, pipelines,
//! `MULTI` with a flip between the queue and `EXEC`, `COPY ... DB`) by callers of two tenants
//! (one bound to a subject) on three subjects, with flips, consent withdrawals and token
//! revocations interleaved, each answer checked against a model of who owns what and who may
//! read it, and every key the model holds counted in Redis itself after each step. The route
//! runs in-process on a real listener, against the Redis on 127.0.0.1:6379 and a SQLite state
//! store. `LETHE_MODEL_CASES` sets how many sequences (default 64; the issue's run is 10 000).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lethe_policy::audit::AuditEntry;
use lethe_policy::{Action, ConsentGrant, RetentionPolicy, RetentionRule};
use proptest::prelude::*;

use crate::auth::access::Tokens;
use crate::auth::{Claims, Role, Verifier, mint_hs256};
use crate::config::Config;
use crate::data::{DataState, Limits, serve_connections};
use crate::redis::client::{Client, Server};
use crate::redis::resp::{Proto, Reply};
use crate::state::Store;
use crate::testing::{erasure_request, fresh_sqlite_url, migrated};

const SECRET: &[u8] = b"redis-model-test-secret";
const REDIS: &str = "redis://127.0.0.1:6379";
/// The subjects: (tenant, name), the same in every sequence (each sequence has its own names).
const SUBJECTS: [(&str, &str); 3] = [("acme", "alice"), ("acme", "bob"), ("globex", "carol")];
/// The callers: (tenant, bound subject).
const CALLERS: [(&str, Option<usize>); 3] = [("acme", None), ("acme", Some(0)), ("globex", None)];

#[derive(Debug, Clone)]
enum Op {
    Set {
        caller: usize,
        owner: usize,
        slot: u8,
        value: u8,
    },
    Get {
        caller: usize,
        owner: usize,
        slot: u8,
    },
    Push {
        caller: usize,
        owner: usize,
        slot: u8,
        value: u8,
    },
    Range {
        caller: usize,
        owner: usize,
        slot: u8,
    },
    /// `SET` then `GET` of every key named, sent at once.
    Pipeline {
        caller: usize,
        keys: Vec<(usize, u8)>,
        value: u8,
    },
    /// `MULTI`, a `GET` of each key queued, then (maybe) a flip, then `EXEC`.
    Transaction {
        caller: usize,
        keys: Vec<(usize, u8)>,
        flip: Option<usize>,
    },
    CopyToAnotherDatabase {
        caller: usize,
        owner: usize,
        slot: u8,
    },
    Flip {
        subject: usize,
    },
    Withdraw {
        subject: usize,
    },
    Revoke {
        caller: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let caller = 0..CALLERS.len();
    let owner = 0..SUBJECTS.len();
    let slot = 0u8..3;
    let keys = prop::collection::vec((0..SUBJECTS.len(), 0u8..3), 1..4);
    prop_oneof![
        6 => (caller.clone(), owner.clone(), slot.clone(), any::<u8>())
            .prop_map(|(caller, owner, slot, value)| Op::Set { caller, owner, slot, value }),
        6 => (caller.clone(), owner.clone(), slot.clone())
            .prop_map(|(caller, owner, slot)| Op::Get { caller, owner, slot }),
        3 => (caller.clone(), owner.clone(), slot.clone(), any::<u8>())
            .prop_map(|(caller, owner, slot, value)| Op::Push { caller, owner, slot, value }),
        3 => (caller.clone(), owner.clone(), slot.clone())
            .prop_map(|(caller, owner, slot)| Op::Range { caller, owner, slot }),
        2 => (caller.clone(), keys.clone(), any::<u8>())
            .prop_map(|(caller, keys, value)| Op::Pipeline { caller, keys, value }),
        2 => (caller.clone(), keys, prop::option::of(owner.clone()))
            .prop_map(|(caller, keys, flip)| Op::Transaction { caller, keys, flip }),
        1 => (caller.clone(), owner.clone(), slot)
            .prop_map(|(caller, owner, slot)| Op::CopyToAnotherDatabase { caller, owner, slot }),
        1 => owner.clone().prop_map(|subject| Op::Flip { subject }),
        1 => owner.prop_map(|subject| Op::Withdraw { subject }),
        1 => caller.prop_map(|caller| Op::Revoke { caller }),
    ]
}

/// What the route runs on, made once for every sequence.
struct World {
    store: Arc<dyn Store>,
    lethe: std::net::SocketAddr,
    prefix: String,
    _stop: tokio::sync::watch::Sender<bool>,
}

/// One sequence's subjects, callers and the model of what each may do.
struct Case<'w> {
    world: &'w World,
    /// Each subject's key in this sequence.
    names: Vec<String>,
    grants: Vec<String>,
    flipped: Vec<bool>,
    withdrawn: Vec<bool>,
    tokens: Vec<(String, String)>,
    revoked: Vec<bool>,
    connections: Vec<Option<Client>>,
    /// What Redis holds under each key Lethe wrote: a string, or a list.
    strings: BTreeMap<String, String>,
    lists: BTreeMap<String, Vec<String>>,
    direct: Client,
}

fn audit() -> AuditEntry {
    AuditEntry {
        at: crate::now(),
        tenant: None,
        actor: "model".into(),
        action: "model".into(),
        request_id: "model".into(),
        subject_ref: None,
        target: "model".into(),
        target_ref: None,
        result: "ok".into(),
        attempt: 1,
    }
}

fn tls() -> Arc<rustls::ClientConfig> {
    crate::data::forward::tls_client(None).expect("a TLS configuration")
}

async fn world() -> World {
    let prefix = format!("m{}", uuid::Uuid::new_v4().simple());
    let config = Config::check(&format!(
        r#"
        [[routes]]
        name = "cache"
        listen = "127.0.0.1:1"
        upstream = "{REDIS}"
        adapter = "redis"
        keys = [{{ pattern = "{prefix}:{{tenant}}:{{subject}}:*", purpose = "support", category = "conversation" }}]
        "#
    ))
    .expect("the configuration");
    let store = migrated(&fresh_sqlite_url()).await;
    for tenant in ["acme", "globex"] {
        let rules = RetentionPolicy {
            rules: vec![RetentionRule {
                purpose: "support".into(),
                category: "conversation".into(),
                layer: None,
                max_age: "30d".parse().expect("a duration"),
                legal_end: None,
            }],
            purpose_ends: vec![],
        };
        store
            .replace_retention(tenant, &rules, crate::now(), "model", audit())
            .await
            .expect("retention");
    }
    let routes = crate::routes(&config).expect("the routes");
    let route = routes[0].clone();
    let verifier = Arc::new(Verifier::hs256(SECRET, "lethe", 0).expect("a verifier"));
    let (state, _lineage) = DataState::build(
        &config,
        routes,
        Arc::clone(&store),
        Tokens::lethe(verifier),
        Arc::from(&b"k"[..]),
    )
    .expect("the data plane");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let lethe = listener.local_addr().expect("its address");
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(serve_connections(
        listener,
        route,
        state,
        stopping,
        Limits::default(),
    ));
    World {
        store,
        lethe,
        prefix,
        _stop: stop,
    }
}

async fn connect(url: &str, credential: Option<(String, String)>) -> Option<Client> {
    let server = Server::of_url(url, credential).ok()?;
    Client::connect(&server, &tls(), Proto::Resp2, Duration::from_secs(10))
        .await
        .ok()
}

fn text(reply: &Reply) -> Option<String> {
    match reply {
        Reply::Bulk(bytes) | Reply::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into()),
        _ => None,
    }
}

fn list_of(reply: &Reply) -> Option<Vec<String>> {
    match reply {
        Reply::Array(items) => items.iter().map(text).collect(),
        _ => None,
    }
}

fn args(parts: &[&str]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.as_bytes().to_vec()).collect()
}

impl<'w> Case<'w> {
    async fn new(world: &'w World, n: usize) -> Case<'w> {
        let run = uuid::Uuid::new_v4().simple().to_string();
        let names: Vec<String> = SUBJECTS
            .iter()
            .map(|(_, name)| format!("{name}{}", &run[..8]))
            .collect();
        let mut grants = Vec::new();
        for (i, (tenant, _)) in SUBJECTS.iter().enumerate() {
            let grant = ConsentGrant {
                id: format!("g{n}-{i}-{run}"),
                tenant: (*tenant).into(),
                subject: names[i].clone(),
                purpose: "support".into(),
                category: "conversation".into(),
                actions: [Action::Store, Action::Retrieve].into_iter().collect(),
                granted_at: crate::now() - chrono::TimeDelta::seconds(1),
                expires_at: None,
                revoked_at: None,
                policy_version: 1,
                source: "model".into(),
            };
            world
                .store
                .create_grant(&grant, audit())
                .await
                .expect("a grant");
            grants.push(grant.id);
        }
        let mut tokens = Vec::new();
        for (tenant, bound) in CALLERS {
            let jti = uuid::Uuid::new_v4().to_string();
            let claims = Claims {
                sub: "model".into(),
                tenant: tenant.into(),
                role: Role::Agent,
                subject: bound.map(|s| names[s].clone()),
                exp: jsonwebtoken::get_current_timestamp() + 600,
                jti: Some(jti.clone()),
                name: None,
                second_factor: false,
            };
            tokens.push((mint_hs256(SECRET, "lethe", &claims).expect("a token"), jti));
        }
        let mut connections = Vec::new();
        for (token, _) in &tokens {
            let url = format!("redis://{}", world.lethe);
            connections.push(connect(&url, Some(("agent".into(), token.clone()))).await);
        }
        assert!(
            connections.iter().all(Option::is_some),
            "every caller connects"
        );
        Case {
            world,
            names,
            grants,
            flipped: vec![false; SUBJECTS.len()],
            withdrawn: vec![false; SUBJECTS.len()],
            revoked: vec![false; CALLERS.len()],
            tokens,
            connections,
            strings: BTreeMap::new(),
            lists: BTreeMap::new(),
            direct: connect(REDIS, None).await.expect("Redis on 127.0.0.1:6379"),
        }
    }

    fn key(&self, owner: usize, kind: &str, slot: u8) -> String {
        let (tenant, _) = SUBJECTS[owner];
        format!(
            "{}:{tenant}:{}:{kind}{slot}",
            self.world.prefix, self.names[owner]
        )
    }

    /// Whether `caller` may name `owner`'s keys at all.
    fn in_scope(&self, caller: usize, owner: usize) -> bool {
        let (tenant, bound) = CALLERS[caller];
        SUBJECTS[owner].0 == tenant && bound.is_none_or(|b| b == owner)
    }

    fn may_write(&self, caller: usize, owner: usize) -> bool {
        !self.revoked[caller]
            && self.in_scope(caller, owner)
            && !self.flipped[owner]
            && !self.withdrawn[owner]
    }

    /// What a read of `owner`'s key answers `caller`: refused (`None`), or answered, hidden
    /// (`Some(false)`) or shown (`Some(true)`).
    fn read(&self, caller: usize, owner: usize) -> Option<bool> {
        (!self.revoked[caller] && self.in_scope(caller, owner))
            .then(|| !self.flipped[owner] && !self.withdrawn[owner])
    }

    async fn call(&mut self, caller: usize, commands: &[Vec<Vec<u8>>]) -> Option<Vec<Reply>> {
        let connection = self.connections[caller].as_mut()?;
        match connection.call(commands).await {
            Ok(replies) => Some(replies),
            Err(_) => {
                self.connections[caller] = None;
                None
            }
        }
    }

    async fn step(&mut self, op: &Op) {
        match *op {
            Op::Set {
                caller,
                owner,
                slot,
                value,
            } => {
                let key = self.key(owner, "s", slot);
                let value = value.to_string();
                let replies = self.call(caller, &[args(&["SET", &key, &value])]).await;
                let ok = replies.as_ref().is_some_and(|r| r[0] == Reply::ok());
                assert_eq!(ok, self.may_write(caller, owner), "{op:?}: {replies:?}");
                if ok {
                    self.strings.insert(key, value);
                }
            }
            Op::Get {
                caller,
                owner,
                slot,
            } => {
                let key = self.key(owner, "s", slot);
                let replies = self.call(caller, &[args(&["GET", &key])]).await;
                self.check_read(caller, owner, &key, replies.map(|mut r| r.remove(0)), op);
            }
            Op::Push {
                caller,
                owner,
                slot,
                value,
            } => {
                let key = self.key(owner, "l", slot);
                let value = value.to_string();
                let replies = self.call(caller, &[args(&["RPUSH", &key, &value])]).await;
                let ok = replies
                    .as_ref()
                    .is_some_and(|r| matches!(r[0], Reply::Int(_)));
                assert_eq!(ok, self.may_write(caller, owner), "{op:?}: {replies:?}");
                if ok {
                    self.lists.entry(key).or_default().push(value);
                }
            }
            Op::Range {
                caller,
                owner,
                slot,
            } => {
                let key = self.key(owner, "l", slot);
                let replies = self
                    .call(caller, &[args(&["LRANGE", &key, "0", "-1"])])
                    .await;
                let answer = replies.map(|mut r| r.remove(0));
                match (self.read(caller, owner), answer) {
                    (None, answer) => assert!(!matches!(answer, Some(Reply::Array(_))), "{op:?}"),
                    (Some(shown), Some(answer)) => {
                        let want = match shown {
                            true => self.lists.get(&key).cloned().unwrap_or_default(),
                            false => Vec::new(),
                        };
                        assert_eq!(list_of(&answer), Some(want), "{op:?}");
                    }
                    (Some(_), None) => panic!("{op:?}: the connection was lost"),
                }
            }
            Op::Pipeline {
                caller,
                ref keys,
                value,
            } => {
                let value = value.to_string();
                let mut commands = Vec::new();
                for &(owner, slot) in keys {
                    let key = self.key(owner, "s", slot);
                    commands.push(args(&["SET", &key, &value]));
                    commands.push(args(&["GET", &key]));
                }
                let replies = self.call(caller, &commands).await;
                for (i, &(owner, slot)) in keys.iter().enumerate() {
                    let key = self.key(owner, "s", slot);
                    let set = replies.as_ref().map(|r| r[2 * i].clone());
                    let ok = set == Some(Reply::ok());
                    assert_eq!(ok, self.may_write(caller, owner), "{op:?} set {i}: {set:?}");
                    if ok {
                        self.strings.insert(key.clone(), value.clone());
                    }
                    let got = replies.as_ref().map(|r| r[2 * i + 1].clone());
                    self.check_read(caller, owner, &key, got, op);
                }
            }
            Op::Transaction {
                caller,
                ref keys,
                flip,
            } => {
                let queued = self.call(caller, &[args(&["MULTI"])]).await;
                let mut refused = queued.is_none();
                for &(owner, slot) in keys {
                    let key = self.key(owner, "s", slot);
                    let answer = self.call(caller, &[args(&["GET", &key])]).await;
                    refused |= !answer.is_some_and(|r| r[0] == Reply::Simple(b"QUEUED".to_vec()));
                }
                if let Some(subject) = flip {
                    self.flip(subject).await;
                }
                let exec = self.call(caller, &[args(&["EXEC"])]).await;
                let in_scope = keys
                    .iter()
                    .all(|&(owner, _)| self.read(caller, owner).is_some());
                assert_eq!(!refused, in_scope, "{op:?}: queued");
                match (refused, exec.map(|mut r| r.remove(0))) {
                    (true, answer) => assert!(!matches!(answer, Some(Reply::Array(_))), "{op:?}"),
                    (false, Some(Reply::Array(answers))) => {
                        for (&(owner, slot), answer) in keys.iter().zip(answers) {
                            let key = self.key(owner, "s", slot);
                            self.check_read(caller, owner, &key, Some(answer), op);
                        }
                    }
                    (false, other) => panic!("{op:?}: EXEC answered {other:?}"),
                }
            }
            Op::CopyToAnotherDatabase {
                caller,
                owner,
                slot,
            } => {
                let key = self.key(owner, "s", slot);
                let replies = self
                    .call(caller, &[args(&["COPY", &key, &key, "DB", "1"])])
                    .await;
                assert!(
                    !matches!(replies.as_deref(), Some([Reply::Int(_)])),
                    "{op:?}"
                );
                let mut other = connect(&format!("{REDIS}/1"), None)
                    .await
                    .expect("database 1");
                let held = other
                    .one(&[b"EXISTS", key.as_bytes()])
                    .await
                    .expect("EXISTS");
                assert_eq!(held, Reply::Int(0), "{op:?}: a copy in database 1");
            }
            Op::Flip { subject } => self.flip(subject).await,
            Op::Withdraw { subject } => {
                if !self.withdrawn[subject] && !self.flipped[subject] {
                    self.world
                        .store
                        .revoke_grant(&self.grants[subject], crate::now(), audit())
                        .await
                        .expect("a withdrawal");
                    self.withdrawn[subject] = true;
                }
            }
            Op::Revoke { caller } => {
                if !self.revoked[caller] {
                    let jti = self.tokens[caller].1.clone();
                    self.world
                        .store
                        .revoke_token(&jti, crate::now(), "model", audit())
                        .await
                        .expect("a revocation");
                    self.revoked[caller] = true;
                }
            }
        }
        self.counted_in_redis().await;
    }

    async fn flip(&mut self, subject: usize) {
        if self.flipped[subject] {
            return;
        }
        let id = format!("er-{}", uuid::Uuid::new_v4().simple());
        let mut request = erasure_request(&id, &self.names[subject], crate::now());
        request.tenant = SUBJECTS[subject].0.into();
        let store = &self.world.store;
        store
            .create_erasure(&request, &["redis:cache".into()], audit())
            .await
            .expect("an erasure");
        store
            .approve_erasure(&id, "dpo", 1, crate::now(), audit())
            .await
            .expect("the flip");
        self.flipped[subject] = true;
    }

    /// A read's answer as the model says it must be: refused, the key's value, or nil.
    fn check_read(&self, caller: usize, owner: usize, key: &str, answer: Option<Reply>, op: &Op) {
        match (self.read(caller, owner), answer) {
            (None, answer) => assert!(
                matches!(answer, None | Some(Reply::Error(_))),
                "{op:?}: a refused read answered {answer:?}"
            ),
            (Some(true), Some(answer)) => {
                assert_eq!(
                    text(&answer),
                    self.strings.get(key).cloned(),
                    "{op:?}: {key}"
                )
            }
            (Some(false), Some(answer)) => assert_eq!(answer, Reply::Null, "{op:?}: {key} hidden"),
            (Some(_), None) => panic!("{op:?}: the connection was lost"),
        }
    }

    /// Every key the model holds, as Redis itself holds it; and nothing more of the sequence's.
    async fn counted_in_redis(&mut self) {
        for (key, value) in &self.strings {
            let held = self
                .direct
                .one(&[b"GET", key.as_bytes()])
                .await
                .expect("GET");
            assert_eq!(text(&held).as_ref(), Some(value), "{key} in Redis");
        }
        for (key, values) in &self.lists {
            let held = self
                .direct
                .one(&[b"LRANGE", key.as_bytes(), b"0", b"-1"])
                .await
                .expect("LRANGE");
            assert_eq!(list_of(&held).as_ref(), Some(values), "{key} in Redis");
        }
        let mut held = 0;
        for name in &self.names {
            let pattern = format!("{}:*:{name}:*", self.world.prefix);
            let reply = self
                .direct
                .one(&[b"KEYS", pattern.as_bytes()])
                .await
                .expect("KEYS");
            held += list_of(&reply).map_or(0, |keys| keys.len());
        }
        assert_eq!(held, self.strings.len() + self.lists.len(), "keys in Redis");
    }

    async fn end(mut self) {
        let keys: Vec<String> = self
            .strings
            .keys()
            .chain(self.lists.keys())
            .cloned()
            .collect();
        if !keys.is_empty() {
            let mut unlink = vec![b"UNLINK".to_vec()];
            unlink.extend(keys.into_iter().map(String::into_bytes));
            let _ = self.direct.call(&[unlink]).await;
        }
    }
}

#[test]
fn random_sequences_by_two_tenants_match_the_model_counted_in_redis() {
    let cases = std::env::var("LETHE_MODEL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let world = runtime.block_on(world());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let n = std::sync::atomic::AtomicUsize::new(0);
    let result = runner.run(&prop::collection::vec(op(), 1..16), |ops| {
        let n = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        runtime.block_on(async {
            let mut case = Case::new(&world, n).await;
            for op in &ops {
                case.step(op).await;
            }
            case.end().await;
        });
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
