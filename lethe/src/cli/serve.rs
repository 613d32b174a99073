//! `lethe serve`: the composition root. Everything the server runs is built here from the
//! configuration and wired together: the state store, the keys, the data plane, the control
//! plane, the purge worker and the retention sweeper, stopped together on SIGINT / SIGTERM.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::{Failure, connect, keyed_chain, purge_sources, schema_ready};
use crate::auth::Verifier;
use crate::auth::access::{AccessTokens, Tokens};
use crate::config::Config;
use crate::control::{self, ControlState};
use crate::data::listen::serve_http;
use crate::data::tls::ServerTls;
use crate::data::{DataState, forward::Route};
use crate::erasure::{PostgresTarget, certificate::Certifier};
use crate::state::Store;

pub(super) async fn serve(config: Config) -> Result<(), Failure> {
    raise_open_files();
    // Built once, for the data plane and for the erasure targets.
    let (routes, governed_targets) = purge_sources(&config)?;
    let keyed = Keyed::open(&config).await?;
    let (data_state, lineage_task) = DataState::build(
        &config,
        routes.clone(),
        Arc::clone(&keyed.store),
        keyed.tokens(&config, Plane::Data),
        Arc::clone(&keyed.audit_key),
    )?;
    let certifier = Arc::new(Certifier::new(
        crate::keys::certificate_signer(&config, keyed.store.as_ref()).await?,
        Certifier::backups_of(&config, &routes),
        Arc::clone(&keyed.audit_key),
    ));
    let control_state = control_state(
        &config,
        &keyed,
        &data_state,
        &routes,
        &governed_targets,
        Arc::clone(&certifier),
    )?;
    let listeners = Listeners::bind(&config, &data_state).await?;
    tracing::info!(
        control = %config.control_plane.listen,
        data = %config.data_plane.listen,
        admin = %config.admin.listen,
        backend = control_state.store.backend(),
        routes = data_state.routes.len(),
        "listening"
    );

    let (stop, stopped) = watch::channel(false);
    let stop_signal = async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    };
    let background = background(
        &config,
        &routes,
        &governed_targets,
        &keyed,
        certifier,
        Arc::clone(&data_state.metrics),
        &stopped,
    )?;
    let limits = crate::data::Limits::of(&config.data_plane);
    let listening = |(listener, tls), name| {
        let gate = crate::data::admission::Gate::new(PEOPLE_LIMITS);
        data_state.metrics.listener(name, gate.clone());
        let grace = limits.timeout;
        (
            listener,
            crate::data::listen::Listening { gate, tls, grace },
        )
    };
    let (admin_listener, admin_listening) = listening(listeners.admin, "admin");
    let admin_app = control::admin::app(control_state.clone());
    let admin = serve_http(
        admin_listener,
        admin_listening,
        move |peer| connection(admin_app.clone(), peer),
        until_stopped(stopped.clone()),
    );
    let (control_listener, control_listening) = listening(listeners.control, "control");
    let control_app = control::app(control_state);
    let control = serve_http(
        control_listener,
        control_listening,
        move |peer| connection(control_app.clone(), peer),
        until_stopped(stopped.clone()),
    );
    let mut own_routes = tokio::task::JoinSet::new();
    for (listener, route) in listeners.own {
        own_routes.spawn(crate::data::serve_connections(
            listener,
            route,
            Arc::clone(&data_state),
            stopped.clone(),
            limits,
        ));
    }
    let own_routes = async move { while own_routes.join_next().await.is_some() {} };
    let (data_listener, data_tls) = listeners.data;
    let data = crate::data::serve(
        data_listener,
        data_state,
        limits,
        data_tls,
        until_stopped(stopped),
    );
    tokio::join!(control, admin, data, own_routes, stop_signal, background);
    // The last lineage rows are written before the process ends.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), lineage_task).await;
    tracing::info!("stopped");
    Ok(())
}

/// The state store, its schema ready (see `schema_ready`), with the keys every plane checks and chains with.
struct Keyed {
    store: Arc<dyn Store>,
    verifier: Arc<Verifier>,
    /// The provider's access tokens (`[auth.oidc]`), where configured.
    provider: Option<Arc<AccessTokens>>,
    audit_key: Arc<[u8]>,
}

#[derive(PartialEq, Eq)]
enum Plane {
    Data,
    Control,
}

impl Keyed {
    async fn open(config: &Config) -> Result<Self, Failure> {
        let store = connect(config).await?;
        schema_ready(store.as_ref()).await?;
        let verifier = Arc::new(crate::keys::verifier(config, store.as_ref()).await?);
        let audit_key: Arc<[u8]> = Arc::from(crate::keys::audit_key(config, store.as_ref()).await?);
        store.use_subject_key(&audit_key);
        keyed_chain(store.as_ref(), &audit_key).await?;
        let forgotten = store.forget_erased(crate::now()).await?;
        if forgotten > 0 {
            tracing::info!(
                forgotten,
                "erased subjects' keys of earlier completions replaced by their references"
            );
        }
        let provider = match &config.auth.oidc {
            Some(access) => {
                let tls = crate::data::forward::tls_of(config).map_err(|e| Failure(e, 2))?;
                let console = config.control_plane.oidc.as_ref();
                let leeway = config.auth.leeway_seconds;
                Some(Arc::new(AccessTokens::new(access, console, leeway, &tls)))
            }
            None => None,
        };
        Ok(Self {
            store,
            verifier,
            provider,
            audit_key,
        })
    }

    /// The tokens `plane` takes: Lethe's own, and the provider's on the control plane (and on
    /// the data plane where `[auth.oidc] data_plane` says so).
    fn tokens(&self, config: &Config, plane: Plane) -> Tokens {
        let data_plane = config.auth.oidc.as_ref().is_some_and(|a| a.data_plane);
        let provider = self
            .provider
            .clone()
            .filter(|_| plane == Plane::Control || data_plane);
        let people = [
            config.control_plane.oidc.as_ref().map(|c| c.issuer.clone()),
            config.auth.oidc.as_ref().map(|a| a.issuer.clone()),
        ];
        Tokens::new(
            Arc::clone(&self.verifier),
            provider,
            people.into_iter().flatten().collect(),
        )
    }
}

fn control_state(
    config: &Config,
    keyed: &Keyed,
    data_state: &Arc<DataState>,
    routes: &[Route],
    governed_targets: &[PostgresTarget],
    certifier: Arc<Certifier>,
) -> Result<ControlState, Failure> {
    let governed = crate::governed::Governed::start(config, Arc::clone(&keyed.store))
        .map_err(|e| Failure(e, 2))?;
    let inventory = Arc::new(crate::erasure::Inventory::new(
        Arc::clone(&keyed.store),
        crate::erasure::targets(
            config,
            routes,
            governed_targets,
            crate::stores::TARGET_KINDS,
            &keyed.audit_key,
        )
        .map_err(|e| Failure(e, 2))?,
        Arc::clone(&keyed.audit_key),
        std::time::Duration::from_secs(10),
    ));
    let oidc = match &config.control_plane.oidc {
        Some(oidc) => {
            let tls = crate::data::forward::tls_of(config).map_err(|e| Failure(e, 2))?;
            let provider = crate::auth::oidc::Provider::new(oidc, config.auth.leeway_seconds, &tls)
                .map_err(|e| Failure(e, 2))?;
            Some(Arc::new(provider))
        }
        None => None,
    };
    Ok(ControlState {
        folding: config.folding(),
        revocations: Arc::clone(&data_state.revocations),
        sign_ins: Arc::default(),
        oidc,
        token_sign_in: config.control_plane.token_sign_in(),
        sessions: control::SessionLimits {
            idle: config.control_plane.session_idle.0,
            max: config.control_plane.session_max.0,
        },
        governed,
        data: Some(Arc::clone(data_state)),
        store: Arc::clone(&keyed.store),
        tokens: keyed.tokens(config, Plane::Control),
        audit_key: Arc::clone(&keyed.audit_key),
        metrics: Arc::default(),
        max_body_bytes: usize::try_from(config.control_plane.max_body_bytes).unwrap_or(usize::MAX),
        erasure: control::ErasureSettings::from_config(config, certifier, inventory),
    })
}

/// Every listener, bound before anything is served: a port taken fails the start, not a plane.
struct Listeners {
    control: (TcpListener, Option<ServerTls>),
    data: (TcpListener, Option<ServerTls>),
    admin: (TcpListener, Option<ServerTls>),
    /// Routes whose stores speak a protocol of their own have listeners of their own.
    own: Vec<(TcpListener, Route)>,
}

impl Listeners {
    async fn bind(config: &Config, data_state: &DataState) -> Result<Self, Failure> {
        let mut own = Vec::new();
        for route in data_state.routes.iter() {
            if let Some(addr) = route.listen {
                own.push((bind(addr).await?, route.clone()));
                tracing::info!(route = %route.name, listen = %addr, "listening");
            }
        }
        let tls = |tls: &Option<crate::config::TlsConfig>, at: &str| {
            let loaded = tls
                .as_ref()
                .map(|tls| crate::data::tls::server_config(tls, at));
            loaded.transpose().map_err(|e| Failure(e, 2))
        };
        Ok(Self {
            control: (
                bind(config.control_plane.listen).await?,
                tls(&config.control_plane.tls, "control_plane")?,
            ),
            data: (
                bind(config.data_plane.listen).await?,
                tls(&config.data_plane.tls, "data_plane")?,
            ),
            admin: (
                bind(config.admin.listen).await?,
                tls(&config.admin.tls, "admin")?,
            ),
            own,
        })
    }
}

/// Raises the soft limit on open files to the hard one, as Go's runtime does: every connection
/// holds a descriptor, and the usual soft limit (1024) is below the data plane's 4096.
fn raise_open_files() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum || limit.maximum.is_none() {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            ..limit
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "the limit on open files could not be raised");
        }
    }
    let open_files = getrlimit(Resource::Nofile).current;
    tracing::info!(?open_files, "open files allowed");
}

/// The connections the control and admin listeners each hold at most, and from one address:
/// people, probes and scrapers, not agents.
const PEOPLE_LIMITS: crate::data::admission::ConnectionLimits =
    crate::data::admission::ConnectionLimits {
        max_connections: 1024,
        max_connections_per_address: 256,
    };

/// The service of one connection from `peer` to `app`: each request carries the peer's address
/// (`ConnectInfo`, by which failed console sign-ins are bounded).
fn connection(
    app: axum::Router,
    peer: SocketAddr,
) -> impl tower::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    use tower::ServiceExt;
    tower::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        app.clone().oneshot(request.map(axum::body::Body::new))
    })
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, Failure> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Failure(format!("cannot listen on {addr}: {e}"), 2))
}

async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// The purge worker, the retention sweeper and the audit heads' signer, run until stopped.
fn background(
    config: &Config,
    routes: &[Route],
    governed_targets: &[PostgresTarget],
    keyed: &Keyed,
    certifier: Arc<Certifier>,
    metrics: Arc<crate::data::metrics::DataMetrics>,
    stopped: &watch::Receiver<bool>,
) -> Result<impl Future<Output = ()> + use<>, Failure> {
    let worker = crate::erasure::Worker::from_config(
        config,
        routes,
        governed_targets,
        crate::stores::TARGET_KINDS,
        Arc::clone(&keyed.store),
        Arc::clone(&keyed.audit_key),
    )
    .map_err(|e| Failure(e, 2))?
    .certifying(Arc::clone(&certifier));
    let purge = worker.run(until_stopped(stopped.clone()));
    let sweeper = crate::erasure::Sweeper::from_config(
        config,
        routes,
        Arc::clone(&keyed.store),
        &keyed.audit_key,
    )
    .map_err(|e| Failure(e, 2))?
    .observed_by(metrics);
    let sweep = sweeper.run(until_stopped(stopped.clone()));
    let anchor = sign_heads(
        certifier,
        Arc::clone(&keyed.store),
        config.audit.sign_interval.0,
        until_stopped(stopped.clone()),
    );
    Ok(async move {
        tokio::join!(purge, sweep, anchor);
    })
}

/// Signs the audit chain's heads every `interval` (those that moved), until `stop`.
async fn sign_heads(
    certifier: Arc<Certifier>,
    store: Arc<dyn Store>,
    interval: std::time::Duration,
    stop: impl Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    let mut every = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = every.tick() => {
                if let Err(e) = certifier.sign_heads_now(store.as_ref()).await {
                    tracing::warn!(error = %e, "the audit chain's head could not be signed; trying again later");
                }
            }
            () = &mut stop => return,
        }
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
