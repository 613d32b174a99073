//! The commands that act through the control plane (tokens, consents, certificates): the call
//! made, its answer printed.

use hyper::Method;
use serde_json::json;

use super::control_api;
use super::{
    CertificateArgs, CertificateCommand, ConsentCommand, ControlArgs, Failure, TokenArgs, open,
};
use crate::auth::{Claims, Role, mint_hs256};
use crate::config::{Config, parse_duration};

pub(super) async fn development_token(config: &Config, claims: &Claims) -> Result<String, Failure> {
    let store = open(config).await?;
    let secret = crate::keys::development_secret(config, store.as_ref()).await?;
    Ok(mint_hs256(&secret, &config.auth.issuer, claims)?)
}

pub(super) async fn token(config: &Config, args: TokenArgs) -> Result<(), Failure> {
    let ttl = parse_duration(&args.ttl)?;
    eprintln!(
        "lethe: a development token, for development only; people sign in with `lethe login` ([auth.oidc])"
    );
    let claims = Claims {
        sub: args.actor.unwrap_or_else(|| format!("{}-cli", args.role)),
        tenant: args.tenant,
        role: args.role,
        subject: args.subject,
        exp: jsonwebtoken::get_current_timestamp().saturating_add(ttl.as_secs()),
        jti: Some(uuid::Uuid::new_v4().to_string()),
        name: None,
        second_factor: false,
    };
    println!("{}", development_token(config, &claims).await?);
    Ok(())
}

impl ControlArgs {
    async fn resolve(&self, config: &Config) -> Result<(String, String), Failure> {
        let url = self
            .url
            .clone()
            .unwrap_or_else(|| format!("http://{}", config.control_plane.listen));
        let signed_in = match &self.token {
            Some(_) => None,
            None => super::login::signed_in_token(config).await?,
        };
        let token = match (self.token.clone(), signed_in) {
            (Some(token), _) | (None, Some(token)) => token,
            // With a provider, people act as themselves: never as a development token's name.
            (None, None) if config.auth.oidc.is_some() => {
                return Err(Failure(
                    "not signed in: run `lethe login` (or give --token)".into(),
                    2,
                ));
            }
            (None, None) => {
                let tenant = self
                    .tenant
                    .clone()
                    .ok_or_else(|| Failure("give --tenant or --token".into(), 2))?;
                let claims = Claims {
                    sub: "compliance-cli".into(),
                    tenant,
                    role: Role::Compliance,
                    subject: None,
                    exp: jsonwebtoken::get_current_timestamp() + 300,
                    jti: Some(uuid::Uuid::new_v4().to_string()),
                    name: None,
                    second_factor: false,
                };
                development_token(config, &claims).await?
            }
        };
        Ok((url.trim_end_matches('/').to_owned(), token))
    }

    fn tenant_query(&self) -> String {
        self.tenant
            .as_ref()
            .map(|t| format!("tenant={}&", encode(t)))
            .unwrap_or_default()
    }
}

/// Percent-encodes a query value.
pub(super) fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub(super) async fn consent(config: &Config, command: ConsentCommand) -> Result<(), Failure> {
    let (method, control, path, body) = match &command {
        ConsentCommand::Grant {
            control,
            subject,
            purpose,
            category,
            actions,
            expires_at,
            source,
            policy_version,
        } => (
            Method::POST,
            control,
            "/v1/consents".to_owned(),
            Some(json!({
                "tenant": control.tenant, "subject": subject, "purpose": purpose, "category": category,
                "actions": actions, "expires_at": expires_at, "source": source, "policy_version": policy_version,
            })),
        ),
        ConsentCommand::Revoke { control, id } => (
            Method::POST,
            control,
            format!("/v1/consents/{}/revoke", encode(id)),
            None,
        ),
        ConsentCommand::List { control, subject } => (
            Method::GET,
            control,
            format!(
                "/v1/consents?{}subject={}",
                control.tenant_query(),
                encode(subject)
            ),
            None,
        ),
    };
    control_call(config, control, method, &path, body).await
}

/// One control-plane call; prints the JSON answer, or fails with it.
pub(super) async fn control_call(
    config: &Config,
    control: &ControlArgs,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<(), Failure> {
    let (url, token) = control.resolve(config).await?;
    let (status, value) =
        control_api::call(method, &format!("{url}{path}"), &token, body.as_ref()).await?;
    let pretty = serde_json::to_string_pretty(&value)?;
    if status.is_success() {
        println!("{pretty}");
        Ok(())
    } else {
        Err(Failure(format!("{status}\n{pretty}"), 1))
    }
}

pub(super) async fn certificate(
    load: &dyn Fn() -> Result<Config, crate::config::ConfigErrors>,
    args: CertificateArgs,
) -> Result<(), Failure> {
    match (args.command, args.id) {
        (Some(CertificateCommand::Verify { file, key }), _) => {
            let document =
                std::fs::read(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            match crate::erasure::certificate::verify(&document, &key) {
                Ok(certificate) => {
                    println!(
                        "valid: erasure {} completed at {}, final backup expiry {}",
                        certificate["request_id"].as_str().unwrap_or("?"),
                        certificate["completed_at"].as_str().unwrap_or("?"),
                        certificate["final_backup_expiry"]
                            .as_str()
                            .unwrap_or("unknown")
                    );
                    let exceptions = certificate["exceptions"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    match certificate["final_copy_expiry"].as_str() {
                        Some(at) => println!("every remaining copy is gone by {at}"),
                        None => println!("final copy expiry unknown: see the exceptions"),
                    }
                    for exception in exceptions {
                        println!("exception: {}", exception.as_str().unwrap_or("?"));
                    }
                    for store in certificate["stores"].as_array().into_iter().flatten() {
                        let target = store["target"].as_str().unwrap_or("?");
                        for line in store["physical"]["verified"]
                            .as_array()
                            .into_iter()
                            .flatten()
                        {
                            println!("verified: {target}: {}", line.as_str().unwrap_or("?"));
                        }
                    }
                    Ok(())
                }
                Err(e) => Err(Failure(format!("INVALID certificate: {e}"), 1)),
            }
        }
        (Some(CertificateCommand::PublicKey), _) => {
            let config = load()?;
            let store = open(&config).await?;
            println!(
                "{}",
                crate::keys::certificate_signer(&config, store.as_ref())
                    .await?
                    .public_key_hex()
            );
            Ok(())
        }
        (None, Some(id)) => {
            let config = load()?;
            let (url, token) = args.control.resolve(&config).await?;
            let path = format!("{url}/v1/erasures/{}/certificate", encode(&id));
            let (status, value) = control_api::call(Method::GET, &path, &token, None).await?;
            if !status.is_success() {
                return Err(Failure(
                    format!("{status}\n{}", serde_json::to_string_pretty(&value)?),
                    1,
                ));
            }
            // Parsing and writing back canonical JSON reproduces the signed bytes exactly.
            println!("{}", serde_json::to_string(&value)?);
            Ok(())
        }
        (None, None) => Err(Failure(
            "give an erasure request id, or verify / public-key".into(),
            2,
        )),
    }
}
