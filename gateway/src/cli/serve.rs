//! `lethe serve`: the composition root. Everything the server runs is built here from the
//! configuration and wired together: the state store, the keys, the data plane, the control
//! plane, the purge worker and the retention sweeper, stopped together on SIGINT / SIGTERM.

use std::sync::Arc;

use super::{Failure, connect, keyed_chain, purge_sources};
use crate::config::Config;
use crate::control::{self, ControlState};

pub(super) async fn serve(config: Config) -> Result<(), Failure> {
    // Built once, for the data plane and for the erasure targets.
    let (routes, governed_targets) = purge_sources(&config)?;
    let store = connect(&config).await?;
    let applied = store.migrate().await?;
    if !applied.is_empty() {
        tracing::info!(?applied, "applied state store migrations");
    }
    let verifier = Arc::new(crate::keys::verifier(&config, store.as_ref()).await?);
    let audit_key: Arc<[u8]> = Arc::from(crate::keys::audit_key(&config, store.as_ref()).await?);
    store.use_subject_key(&audit_key);
    keyed_chain(store.as_ref(), &audit_key).await?;
    let forgotten = store.forget_erased(crate::now()).await?;
    if forgotten > 0 {
        tracing::info!(
            forgotten,
            "erased subjects' keys of earlier completions replaced by their references"
        );
    }
    let (data_state, lineage_task) = crate::data::DataState::build(
        &config,
        routes.clone(),
        Arc::clone(&store),
        Arc::clone(&verifier),
        Arc::clone(&audit_key),
    )?;
    let purge_store = Arc::clone(&store);
    let certifier = Arc::new(crate::erasure::certificate::Certifier::new(
        crate::keys::certificate_signer(&config, store.as_ref()).await?,
        crate::erasure::certificate::Certifier::backups_of(&config, &routes),
        Arc::clone(&audit_key),
    ));
    let governed =
        crate::governed::Governed::start(&config, Arc::clone(&store)).map_err(|e| Failure(e, 2))?;
    let inventory = Arc::new(crate::erasure::Inventory::new(
        Arc::clone(&store),
        crate::erasure::targets(
            &config,
            &routes,
            &governed_targets,
            crate::stores::TARGET_KINDS,
            &audit_key,
        )
        .map_err(|e| Failure(e, 2))?,
        Arc::clone(&audit_key),
        std::time::Duration::from_secs(10),
    ));
    let control_state = ControlState {
        folding: config.folding(),
        revocations: Arc::clone(&data_state.revocations),
        sign_ins: Arc::default(),
        sessions: control::SessionLimits {
            idle: config.control_plane.session_idle.0,
            max: config.control_plane.session_max.0,
        },
        governed,
        lineage: Some(data_state.derivation.memory()),
        store,
        verifier,
        audit_key: Arc::clone(&audit_key),
        metrics: Arc::default(),
        max_body_bytes: usize::try_from(config.control_plane.max_body_bytes).unwrap_or(usize::MAX),
        erasure: control::ErasureSettings::from_config(&config, Arc::clone(&certifier), inventory),
    };
    let bind = |addr: std::net::SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Failure(format!("cannot listen on {addr}: {e}"), 2))
    };
    let control_listener = bind(config.control_plane.listen).await?;
    let data_listener = bind(config.data_plane.listen).await?;
    // Routes whose stores speak a protocol of their own have listeners of their own.
    let mut own_listeners = Vec::new();
    for route in data_state.routes.iter() {
        if let Some(addr) = route.listen {
            own_listeners.push((bind(addr).await?, route.clone()));
            tracing::info!(route = %route.name, listen = %addr, "listening");
        }
    }
    tracing::info!(
        control = %config.control_plane.listen,
        data = %config.data_plane.listen,
        backend = control_state.store.backend(),
        routes = data_state.routes.len(),
        "listening"
    );

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stop_signal = async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    };
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let limits = crate::data::Limits::of(&config.data_plane);
    // The peer's address limits failed console sign-ins.
    let control = axum::serve(
        control_listener,
        control::app(control_state).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(until_stopped(stopped.clone()));
    let worker = crate::erasure::Worker::from_config(
        &config,
        &routes,
        &governed_targets,
        crate::stores::TARGET_KINDS,
        Arc::clone(&purge_store),
        Arc::clone(&audit_key),
    )
    .map_err(|e| Failure(e, 2))?
    .certifying(Arc::clone(&certifier));
    let anchor_certifier = certifier;
    let purge = worker.run(until_stopped(stopped.clone()));
    let sweeper = crate::erasure::Sweeper::from_config(
        &config,
        &routes,
        Arc::clone(&purge_store),
        &audit_key,
    )
    .map_err(|e| Failure(e, 2))?;
    let sweep = sweeper.run(until_stopped(stopped.clone()));
    let anchor = sign_heads(
        Arc::clone(&anchor_certifier),
        Arc::clone(&purge_store),
        config.audit.sign_interval.0,
        until_stopped(stopped.clone()),
    );
    let mut own_routes = tokio::task::JoinSet::new();
    for (listener, route) in own_listeners {
        own_routes.spawn(crate::data::serve_connections(
            listener,
            route,
            Arc::clone(&data_state),
            stopped.clone(),
            limits,
        ));
    }
    let own_routes = async move { while own_routes.join_next().await.is_some() {} };
    let data = crate::data::serve(data_listener, data_state, limits, until_stopped(stopped));
    let (control, (), (), (), (), (), ()) =
        tokio::join!(control, data, own_routes, stop_signal, purge, sweep, anchor);
    control?;
    // The last lineage rows are written before the process ends.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), lineage_task).await;
    tracing::info!("stopped");
    Ok(())
}

/// Signs the audit chain's heads every `interval` (those that moved), until `stop`.
async fn sign_heads(
    certifier: Arc<crate::erasure::certificate::Certifier>,
    store: Arc<dyn crate::state::Store>,
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
