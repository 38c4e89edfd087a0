//! Chat requests: the messages rendered into prompt ids.
//!
//! PLACEHOLDER: rendering through the model's own chat template arrives with
//! fucina-llm's chat-template support; until then `/v1/chat/completions`
//! answers 501 naming what is missing.

use crate::api::{ApiError, Message};
use crate::engine::Engine;

/// The prompt ids of `messages` for `engine`'s model.
///
/// # Errors
/// A 501 until chat templates are supported (see the module's note).
pub(crate) fn render(_engine: &Engine, _messages: &[Message]) -> Result<Vec<u32>, ApiError> {
    Err(ApiError::status(
        501,
        "server_error",
        "chat templates are not supported yet: use /v1/completions",
    ))
}
