//! The one JSON error shape of both planes:
//! `{"error": {"code", "message", "request_id", "details"?}}`.

use serde_json::{Value, json};

pub fn error_body(code: &str, message: &str, request_id: &str, details: Option<&Value>) -> Value {
    let mut error = json!({ "code": code, "message": message, "request_id": request_id });
    if let Some(details) = details {
        error["details"] = details.clone();
    }
    json!({ "error": error })
}
