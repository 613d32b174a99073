//! The stores a data-plane route can front, one folder each.

pub mod chroma;
pub mod langgraph;
pub mod openai;
