//! Chat requests: the messages rendered by the model's own chat template
//! (`fucina_llm::Tokenizer::apply_chat_template`, with the generation prompt
//! of the assistant's turn) and tokenized as the template wrote them (the
//! template places the beginning-of-sequence token itself).

use fucina_llm::chat::ChatMessage;

use crate::api::{ApiError, Message};
use crate::engine::Engine;

/// The prompt ids of `messages` for `engine`'s model.
///
/// # Errors
/// A 400 naming `messages` when the model has no chat template or the
/// template refuses the conversation (its own message, e.g. a system role a
/// template does not take).
pub(crate) fn render(engine: &Engine, messages: &[Message]) -> Result<Vec<u32>, ApiError> {
    let tokenizer = &engine.info().tokenizer;
    let messages: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
        .collect();
    let text = tokenizer
        .apply_chat_template(&messages, true)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}
