//! Why a store could not be purged: a failure a retry may mend, or a configuration that cannot
//! work, which goes to a person at once instead of being retried `max_attempts` times.

use hyper::StatusCode;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectorError {
    /// The store could not be reached or failed this time: retried with backoff.
    #[error("{0}")]
    Unavailable(String),
    /// The store refuses what is configured (credentials, a database, table or column that does
    /// not exist, a read-only replica): no retry can succeed.
    #[error("misconfigured: {0}")]
    Misconfigured(String),
}

/// Errors written as text are failures of the moment.
impl From<String> for ConnectorError {
    fn from(message: String) -> Self {
        ConnectorError::Unavailable(message)
    }
}

impl ConnectorError {
    /// An HTTP store's answer that is not a success: refused credentials are a misconfiguration,
    /// anything else may pass.
    pub fn from_status(what: &str, status: StatusCode) -> Self {
        let message = format!("{what} answered {status}");
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                ConnectorError::Misconfigured(message)
            }
            _ => ConnectorError::Unavailable(message),
        }
    }

    /// A SQL error: refused credentials, a database, schema, table, column or function that does
    /// not exist, missing privileges, a statement that does not parse, or a file that cannot be
    /// opened are misconfigurations; the rest (connections, locks, timeouts) may pass.
    pub fn from_sqlx(what: &str, e: &sqlx::Error) -> Self {
        let message = format!("{what}: {e}");
        let misconfigured = match e {
            sqlx::Error::Configuration(_) => true,
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default();
                // PostgreSQL's SQLSTATE classes; SQLite's result codes 1 (a statement about a
                // table or column that is not there) and 14 (cannot open the file).
                code.starts_with("28")
                    || matches!(
                        code.as_ref(),
                        "3D000" | "3F000" | "42P01" | "42703" | "42883" | "42501" | "42601" | "14"
                    )
                    || (code == "1"
                        && (db.message().contains("no such table")
                            || db.message().contains("no such column")))
            }
            _ => false,
        };
        if misconfigured {
            ConnectorError::Misconfigured(message)
        } else {
            ConnectorError::Unavailable(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_credentials_are_misconfigurations_and_outages_are_not() {
        let refused = ConnectorError::from_status("chroma", StatusCode::UNAUTHORIZED);
        assert!(matches!(refused, ConnectorError::Misconfigured(_)));
        assert_eq!(
            refused.to_string(),
            "misconfigured: chroma answered 401 Unauthorized"
        );
        assert!(matches!(
            ConnectorError::from_status("chroma", StatusCode::SERVICE_UNAVAILABLE),
            ConnectorError::Unavailable(_)
        ));
        let down = sqlx::Error::PoolTimedOut;
        assert!(matches!(
            ConnectorError::from_sqlx("app", &down),
            ConnectorError::Unavailable(_)
        ));
    }
}
