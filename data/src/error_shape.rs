//! The one JSON error shape of both planes:
//! `{"error": {"code", "message", "request_id", "details"?}}`, and every code either plane
//! answers with: the lists in `docs/errors.md` and the OpenAPI document are checked against
//! [`Code::ALL`].

use serde_json::{Value, json};

/// Which plane answers with a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    Data,
    Control,
    Both,
}

macro_rules! codes {
    ($($variant:ident = $text:literal, $plane:ident;)*) => {
        /// A stable error code: clients and tests depend on these names.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Code {
            $($variant),*
        }

        impl Code {
            pub const ALL: &[Code] = &[$(Code::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $text),*
                }
            }

            pub fn plane(self) -> Plane {
                match self {
                    $(Code::$variant => Plane::$plane),*
                }
            }

            /// Whether the data plane (`Plane::Data`) or the control plane answers with it.
            pub fn answered_by(self, plane: Plane) -> bool {
                self.plane() == Plane::Both || self.plane() == plane
            }
        }
    };
}

codes! {
    Unauthenticated = "unauthenticated", Both;
    Forbidden = "forbidden", Both;
    InvalidRequest = "invalid_request", Both;
    BodyTooLarge = "body_too_large", Both;
    SubjectSuppressed = "subject_suppressed", Both;
    StateUnavailable = "state_unavailable", Both;
    ProviderUnavailable = "provider_unavailable", Both;
    Timeout = "timeout", Both;
    Internal = "internal", Both;
    UnknownRoute = "unknown_route", Data;
    UnknownEndpoint = "unknown_endpoint", Data;
    UpstreamUnavailable = "upstream_unavailable", Data;
    UpstreamInvalid = "upstream_invalid", Data;
    Overloaded = "overloaded", Data;
    MissingScope = "missing_scope", Data;
    TooManyThreads = "too_many_threads", Data;
    ScopeViolation = "scope_violation", Data;
    ConsentRequired = "consent_required", Data;
    StaleEpoch = "stale_epoch", Data;
    NoRetentionRule = "no_retention_rule", Data;
    Expired = "expired", Data;
    UnstampedItem = "unstamped_item", Data;
    AlreadyExists = "already_exists", Data;
    DerivedFromErased = "derived_from_erased", Data;
    InvalidJson = "invalid_json", Control;
    ValidationFailed = "validation_failed", Control;
    UnsupportedMediaType = "unsupported_media_type", Both;
    NotFound = "not_found", Control;
    MethodNotAllowed = "method_not_allowed", Control;
    AlreadyRevoked = "already_revoked", Control;
    AlreadyReleased = "already_released", Control;
    NotExtendable = "not_extendable", Control;
    AlreadyApproved = "already_approved", Control;
    NotAwaitingApproval = "not_awaiting_approval", Control;
    ConfusableApprover = "confusable_approver", Control;
    RequesterCannotApprove = "requester_cannot_approve", Control;
    IllegalState = "illegal_state", Control;
    NotCompleted = "not_completed", Control;
    NotDecidable = "not_decidable", Control;
}

/// A refusal of the decision core reaches the client under its own code.
impl From<lethe_policy::Refusal> for Code {
    fn from(refusal: lethe_policy::Refusal) -> Code {
        use lethe_policy::Refusal as R;
        match refusal {
            R::ScopeViolation => Code::ScopeViolation,
            R::SubjectSuppressed => Code::SubjectSuppressed,
            R::StaleEpoch => Code::StaleEpoch,
            R::ConsentRequired => Code::ConsentRequired,
            R::NoRetentionRule => Code::NoRetentionRule,
            R::Expired => Code::Expired,
            R::UnstampedItem => Code::UnstampedItem,
            R::AlreadyExists => Code::AlreadyExists,
            R::DerivedFromErased => Code::DerivedFromErased,
        }
    }
}

pub fn error_body(code: &str, message: &str, request_id: &str, details: Option<&Value>) -> Value {
    let mut error = json!({ "code": code, "message": message, "request_id": request_id });
    if let Some(details) = details {
        error["details"] = details.clone();
    }
    json!({ "error": error })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes a list in `docs/errors.md` names: the backquoted words of the sentence that
    /// starts at `marker` (up to the first full stop outside backquotes).
    fn listed(readme: &str, marker: &str) -> Vec<String> {
        let start = readme
            .find(marker)
            .unwrap_or_else(|| panic!("docs/errors.md has no {marker:?}"));
        let mut quoted = false;
        let end = readme[start..]
            .char_indices()
            .find(|&(_, c)| {
                quoted ^= c == '`';
                c == '.' && !quoted
            })
            .map_or(readme.len(), |(i, _)| start + i);
        let mut codes: Vec<String> = readme[start..end]
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .map(str::to_owned)
            .collect();
        codes.sort();
        codes
    }

    fn codes_of(plane: Plane) -> Vec<String> {
        let mut codes: Vec<String> = Code::ALL
            .iter()
            .filter(|c| c.answered_by(plane))
            .map(|c| c.as_str().to_owned())
            .collect();
        codes.sort();
        codes
    }

    #[test]
    fn the_error_doc_lists_every_code_of_each_plane_and_no_other() {
        let readme = include_str!("../../docs/errors.md");
        assert_eq!(
            listed(
                readme,
                "so every failure is a JSON error with a stable code"
            ),
            codes_of(Plane::Data),
            "data-plane codes in docs/errors.md"
        );
        assert_eq!(
            listed(readme, "for validation), with stable codes"),
            codes_of(Plane::Control),
            "control-plane codes in docs/errors.md"
        );
    }

    #[test]
    fn refusals_keep_their_codes_on_the_wire() {
        for refusal in lethe_policy::Refusal::ALL {
            assert_eq!(Code::from(refusal).as_str(), refusal.code());
            assert!(Code::from(refusal).answered_by(Plane::Data));
        }
    }
}
