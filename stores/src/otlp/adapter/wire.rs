//! OTLP/HTTP on the wire: an export request read (protobuf or OTLP/JSON, gzip within a bound),
//! what the trace store is sent, and the answer to the exporter.

use std::io::Read;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;

/// How an export request is encoded (OTLP/HTTP's two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Protobuf,
    Json,
}

impl Encoding {
    /// The encoding a `Content-Type` names (parameters ignored), if OTLP has it.
    pub fn of(content_type: &str) -> Option<Encoding> {
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        match essence.to_ascii_lowercase().as_str() {
            "application/x-protobuf" => Some(Encoding::Protobuf),
            "application/json" => Some(Encoding::Json),
            _ => None,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Protobuf => "application/x-protobuf",
            Encoding::Json => "application/json",
        }
    }
}

/// Why an export request cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// It inflates past the limit (bytes).
    TooLarge(usize),
    Invalid(String),
}

/// The export request in `body`, gunzipped first when `gzip`; a body that inflates past `limit`
/// bytes is refused before it is all inflated.
pub fn decode(
    body: &[u8],
    gzip: bool,
    encoding: Encoding,
    limit: usize,
) -> Result<ExportTraceServiceRequest, DecodeError> {
    let inflated;
    let body = if gzip {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(body)
            .take(limit as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|_| DecodeError::Invalid("the body is not gzip".into()))?;
        if out.len() > limit {
            return Err(DecodeError::TooLarge(limit));
        }
        inflated = out;
        inflated.as_slice()
    } else {
        body
    };
    match encoding {
        Encoding::Protobuf => ExportTraceServiceRequest::decode(body).map_err(|_| {
            DecodeError::Invalid("the body is not an OTLP ExportTraceServiceRequest".into())
        }),
        Encoding::Json => serde_json::from_slice(body).map_err(|e| {
            DecodeError::Invalid(format!(
                "the body is not an OTLP/JSON ExportTraceServiceRequest (line {}, column {})",
                e.line(),
                e.column()
            ))
        }),
    }
}

/// The request as the trace store is sent it (protobuf: what every OTLP receiver takes).
pub fn encode(request: &ExportTraceServiceRequest) -> Vec<u8> {
    request.encode_to_vec()
}

/// OTLP's answer to the exporter, in its encoding: a partial success when spans were refused.
pub fn answer(rejected: i64, message: &str, encoding: Encoding) -> Vec<u8> {
    let response = ExportTraceServiceResponse {
        partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
            rejected_spans: rejected,
            error_message: message.to_owned(),
        }),
    };
    match encoding {
        Encoding::Protobuf => response.encode_to_vec(),
        Encoding::Json => serde_json::to_vec(&response).unwrap_or_default(),
    }
}
