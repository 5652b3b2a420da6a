//! Chat policy: a package's chat template (Jinja, as Hugging Face tokenizers and GGUF files ship it) rendered
//! by the server with minijinja. The template is package code and therefore untrusted: it runs with a fuel
//! budget and a recursion limit, has no loader (no `include`/`import` of files) and no access to anything but
//! the values given to it. Requests supply data only (the messages), never template text, so a message that
//! contains `{{ ... }}` is rendered literally.

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

/// Fuel for one rendering (minijinja counts roughly one unit per instruction).
const FUEL: u64 = 2_000_000;
/// The largest rendered prompt, in bytes.
pub const MAX_RENDERED_BYTES: usize = 4 << 20;
/// The largest template a package may declare, in bytes.
pub const MAX_TEMPLATE_BYTES: usize = 64 << 10;

/// One chat message: a role and its text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// Reads OpenAI `messages`: an array of `{role, content}` objects whose content is a string or an array of
/// `{"type": "text", "text": ...}` parts (joined with no separator). Errors name the message and field.
pub fn parse_messages(v: &Json) -> Result<Vec<Message>, String> {
    let arr = v
        .as_array()
        .ok_or("`messages` must be an array of message objects")?;
    if arr.is_empty() {
        return Err("`messages` must hold at least one message".into());
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let obj = m
            .as_object()
            .ok_or_else(|| format!("`messages[{i}]` must be an object"))?;
        let role = obj
            .get("role")
            .and_then(Json::as_str)
            .ok_or_else(|| format!("`messages[{i}].role` must be a string"))?;
        if !matches!(role, "system" | "developer" | "user" | "assistant") {
            return Err(format!(
                "`messages[{i}].role` is {role:?}; expected system, developer, user or assistant"
            ));
        }
        let content = match obj.get("content") {
            Some(Json::String(s)) => s.clone(),
            Some(Json::Array(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (
                        p.get("type").and_then(Json::as_str),
                        p.get("text").and_then(Json::as_str),
                    ) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        (Some("text"), None) => {
                            return Err(format!(
                                "`messages[{i}].content[{j}].text` must be a string"
                            ));
                        }
                        (Some(other), _) => {
                            return Err(format!(
                                "`messages[{i}].content[{j}]` is a {other:?} part; this model takes text parts only"
                            ));
                        }
                        (None, _) => {
                            return Err(format!(
                                "`messages[{i}].content[{j}].type` must be a string"
                            ));
                        }
                    }
                }
                text
            }
            Some(Json::Null) | None => {
                return Err(format!(
                    "`messages[{i}].content` is missing; this model takes text content"
                ));
            }
            Some(_) => {
                return Err(format!(
                    "`messages[{i}].content` must be a string or an array of text parts"
                ));
            }
        };
        // `developer` is OpenAI's newer name for `system`.
        let role = if role == "developer" { "system" } else { role };
        out.push(Message {
            role: role.to_string(),
            content,
        });
    }
    Ok(out)
}

/// A package's chat template.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(64);
    // Hugging Face templates call raise_exception("...") to refuse a conversation they cannot frame.
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env
}

impl ChatTemplate {
    /// Checks that `source` parses (a package error at registration, naming `file`).
    pub fn new(
        file: &str,
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, String> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(format!(
                "{file}: the chat template is {} bytes; at most {MAX_TEMPLATE_BYTES}",
                source.len()
            ));
        }
        let env = environment();
        env.template_from_str(source)
            .map_err(|e| format!("{file}: the chat template does not parse: {}", describe(&e)))?;
        Ok(ChatTemplate {
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The prompt text for `messages`, ending with the assistant's turn opened when `add_generation_prompt`.
    /// A template that fails (its `raise_exception`, running out of fuel, an output over
    /// [`MAX_RENDERED_BYTES`]) is the request's error, with the template's own message.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let env = environment();
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let out = env.render_str(&self.source, ctx).map_err(|e| {
            format!(
                "the model's chat template refused the messages: {}",
                describe(&e)
            )
        })?;
        if out.len() > MAX_RENDERED_BYTES {
            return Err(format!(
                "the rendered conversation is {} bytes; at most {MAX_RENDERED_BYTES}",
                out.len()
            ));
        }
        Ok(out)
    }
}

/// An error's message without minijinja's template-name decorations.
fn describe(e: &Error) -> String {
    match e.kind() {
        ErrorKind::OutOfFuel => "the template ran too long (out of fuel)".to_string(),
        _ => e
            .detail()
            .map_or_else(|| e.kind().to_string(), str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_like_the_reference() {
        let t = ChatTemplate::new("chat_template.jinja", SMOLLM2, "", "").unwrap();
        let m = parse_messages(&json!([{"role": "user", "content": "Hi {{ x }}"}])).unwrap();
        assert_eq!(
            t.render(&m, true).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi {{ x }}<|im_end|>\n<|im_start|>assistant\n"
        );
        let m = parse_messages(&json!([
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ]))
        .unwrap();
        assert_eq!(
            t.render(&m, false).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nab<|im_end|>\n"
        );
    }

    #[test]
    fn bad_messages_name_the_field() {
        for (v, want) in [
            (json!({}), "`messages` must be an array"),
            (json!([]), "at least one"),
            (
                json!([{"role": "tool", "content": "x"}]),
                "`messages[0].role`",
            ),
            (
                json!([{"role": "user"}]),
                "`messages[0].content` is missing",
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "image_url"}]}]),
                "`messages[1].content[0]` is a \"image_url\" part",
            ),
            (
                json!([{"role": "user", "content": 3}]),
                "`messages[0].content` must be",
            ),
        ] {
            let e = parse_messages(&v).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn templates_are_contained() {
        assert!(
            ChatTemplate::new("t.jinja", "{% for %}", "", "")
                .unwrap_err()
                .contains("t.jinja: the chat template does not parse")
        );
        let t = ChatTemplate::new(
            "t.jinja",
            "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}{{ messages[0].content }}",
            "",
            "",
        )
        .unwrap();
        let one = parse_messages(&json!([{"role": "user", "content": "a"}])).unwrap();
        assert_eq!(t.render(&one, false).unwrap(), "a");
        let two = parse_messages(
            &json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
        )
        .unwrap();
        assert!(
            t.render(&two, false)
                .unwrap_err()
                .contains("one message only")
        );
        // A runaway template stops on fuel; one that tries to include a file has no loader.
        let spin = ChatTemplate::new(
            "t.jinja",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(
            spin.render(&one, false)
                .unwrap_err()
                .contains("out of fuel")
        );
        let inc = ChatTemplate::new("t.jinja", "{% include '/etc/passwd' %}", "", "").unwrap();
        let e = inc.render(&one, false).unwrap_err();
        assert!(!e.contains("root:"), "{e}");
    }
}
