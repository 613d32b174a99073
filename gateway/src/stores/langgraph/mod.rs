pub mod adapter;
pub(crate) mod connector;
pub(crate) mod route;
