//! OpenAI chat and text completions over retained-text models: `POST /v1/chat/completions` and
//! `POST /v1/completions`, non-streamed or streamed as server-sent events (`stream: true`). Both are built from
//! the same engine events, so a streamed response's text is the non-streamed one's. Documented in
//! `docs/serving/http.md`.

use crate::error::ApiError;
use crate::state::{St, body_json};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json, json};
use serve_contracts::retained::sampling::{MAX_TOP_LOGPROBS, Sample, SamplingParams};
use serve_contracts::retained::service::token_bytes;
use serve_contracts::retained::{Event, Finish, GenRequest, RetainedService, Ticket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// Which route: the chat form (messages) or the text form (a prompt).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    Chat,
    Text,
}

/// The most stop strings a request may give.
const MAX_STOPS: usize = 16;

pub(crate) async fn chat_completions(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    complete(st, body, Form::Chat).await
}

pub(crate) async fn completions(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    complete(st, body, Form::Text).await
}

/// The retained-text model `name` (404 unknown, 503 not ready, 501 not a chat model).
pub(crate) fn text_service(
    st: &crate::state::AppState,
    name: &str,
) -> Result<Arc<RetainedService>, ApiError> {
    let svc = st.registry.service(name)?;
    if svc.model().doc.role != "chat" {
        return Err(ApiError::from(serve_runtime::Error::Unsupported(format!(
            "model `{name}` serves {}, not chat or completions",
            svc.model().doc.role
        ))));
    }
    svc.as_any().downcast::<RetainedService>().map_err(|_| {
        ApiError::from(serve_runtime::Error::Unsupported(format!(
            "model `{name}` is not a text model"
        )))
    })
}

/// Reads the optional field `name`: absent or null gives `None`; a value of another type is a 400.
fn field<'a, T>(
    o: &'a Map<String, Json>,
    name: &str,
    what: &str,
    get: impl Fn(&'a Json) -> Option<T>,
) -> Result<Option<T>, ApiError> {
    match o.get(name) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => get(v)
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(format!("`{name}` must be {what}"))),
    }
}

fn number(o: &Map<String, Json>, name: &str) -> Result<Option<f32>, ApiError> {
    field(o, name, "a number", |v| v.as_f64().map(|x| x as f32))
}

fn count(o: &Map<String, Json>, name: &str) -> Result<Option<u64>, ApiError> {
    field(o, name, "a non-negative integer", Json::as_u64)
}

/// The sampling and length parameters common to both forms.
pub(crate) fn parse_request(
    o: &Map<String, Json>,
    form: Form,
) -> Result<(GenRequest, bool, bool), ApiError> {
    let mut p = SamplingParams::default();
    if let Some(t) = number(o, "temperature")? {
        p.temperature = t;
    }
    if let Some(t) = number(o, "top_p")? {
        p.top_p = t;
    }
    if let Some(k) = field(o, "top_k", "an integer (-1 or 0: no limit)", Json::as_i64)? {
        p.top_k = usize::try_from(k).unwrap_or(0);
    }
    if let Some(m) = number(o, "min_p")? {
        p.min_p = m;
    }
    if let Some(r) = number(o, "repetition_penalty")? {
        p.repetition_penalty = r;
    }
    if let Some(x) = number(o, "presence_penalty")? {
        p.presence_penalty = x;
    }
    if let Some(x) = number(o, "frequency_penalty")? {
        p.frequency_penalty = x;
    }
    if let Some(bias) = field(
        o,
        "logit_bias",
        "an object of token id -> bias",
        Json::as_object,
    )? {
        for (k, v) in bias {
            let id: u32 = k.parse().map_err(|_| {
                ApiError::bad_request(format!("`logit_bias` key {k:?} is not a token id"))
            })?;
            let b = v.as_f64().ok_or_else(|| {
                ApiError::bad_request(format!("`logit_bias[{k}]` must be a number"))
            })?;
            p.logit_bias.push((id, b as f32));
        }
    }
    p.seed = match field(o, "seed", "an integer", Json::as_i64)? {
        Some(s) => s as u64,
        None => random_seed(),
    };
    // Log probabilities: chat `logprobs: true` + `top_logprobs: k`; text `logprobs: k`.
    match form {
        Form::Chat => {
            p.logprobs = field(o, "logprobs", "a boolean", Json::as_bool)?.unwrap_or(false);
            let k = count(o, "top_logprobs")?.unwrap_or(0);
            if k > 0 && !p.logprobs {
                return Err(ApiError::bad_request(
                    "`top_logprobs` needs `logprobs: true`",
                ));
            }
            p.top_logprobs = k.min(MAX_TOP_LOGPROBS as u64 + 1) as usize;
        }
        Form::Text => {
            if let Some(k) = count(o, "logprobs")? {
                p.logprobs = true;
                p.top_logprobs = k.min(MAX_TOP_LOGPROBS as u64 + 1) as usize;
            }
        }
    }
    let max_tokens = match form {
        Form::Chat => count(o, "max_completion_tokens")?.or(count(o, "max_tokens")?),
        Form::Text => count(o, "max_tokens")?.or(Some(16)),
    };
    let stop = match o.get("stop") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::String(s)) => vec![s.clone()],
        Some(Json::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::bad_request("`stop` must be a string or an array of strings")
            })?,
        Some(_) => {
            return Err(ApiError::bad_request(
                "`stop` must be a string or an array of strings",
            ));
        }
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad_request(format!(
            "`stop` holds at most {MAX_STOPS} strings"
        )));
    }
    let n = count(o, "n")?.unwrap_or(1);
    let stream = field(o, "stream", "a boolean", Json::as_bool)?.unwrap_or(false);
    let include_usage = match field(o, "stream_options", "an object", Json::as_object)? {
        Some(so) => field(so, "include_usage", "a boolean", Json::as_bool)?.unwrap_or(false),
        None => false,
    };
    let ignore_eos = field(o, "ignore_eos", "a boolean", Json::as_bool)?.unwrap_or(false);
    Ok((
        GenRequest {
            prompt: Vec::new(),
            sampling: p,
            max_tokens: max_tokens
                .unwrap_or(u64::from(u32::MAX))
                .min(u64::from(u32::MAX)) as u32,
            stop,
            n: n.min(u64::from(u32::MAX)) as u32,
            ignore_eos,
            prompt_logprobs: false,
        },
        stream,
        include_usage,
    ))
}

/// A seed for a request that gives none (each such request samples differently).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

async fn complete(
    st: Arc<crate::state::AppState>,
    body: Result<Bytes, BytesRejection>,
    form: Form,
) -> Result<Response, ApiError> {
    let body = body_json(body)?;
    let o = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    let model = o
        .get("model")
        .and_then(Json::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` (a string) is required"))?
        .to_string();
    let svc = text_service(&st, &model)?;
    let (mut req, stream, include_usage) = parse_request(o, form)?;
    // `echo` (completions): each choice's text starts with the prompt; with `logprobs`, so do its log
    // probabilities (the first prompt token's is null), and `max_tokens` may be 0 to score the prompt only.
    let echo = match form {
        Form::Text => field(o, "echo", "a boolean", Json::as_bool)?.unwrap_or(false),
        Form::Chat => false,
    };
    req.max_tokens = req.max_tokens.min(svc.limits.context);
    req.prompt = match form {
        Form::Chat => {
            let template = svc.chat.as_ref().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "model `{model}` has no chat template; use /v1/completions"
                ))
            })?;
            let messages = serve_contracts::retained::chat::parse_messages(
                o.get("messages").unwrap_or(&Json::Null),
            )
            .map_err(ApiError::bad_request)?;
            let text = template
                .render(&messages, true)
                .map_err(ApiError::bad_request)?;
            svc.encode(&text)?
        }
        Form::Text => text_prompt(&svc, o.get("prompt"))?.ok_or_else(|| {
            ApiError::bad_request("`prompt` (a string or an array of token ids) is required")
        })?,
    };
    let echo = match (echo, req.prompt.first()) {
        (true, Some(&first)) => {
            let text = match o.get("prompt") {
                Some(Json::String(t)) => t.clone(),
                _ => {
                    let bytes: Vec<u8> = req
                        .prompt
                        .iter()
                        .flat_map(|&t| token_bytes(&svc.model, t))
                        .collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                }
            };
            Some(Echo { text, first })
        }
        _ => None,
    };
    req.prompt_logprobs = echo.is_some() && req.sampling.logprobs;
    let (sink, rx) = event_channel();
    let n = req.n;
    let ticket = svc.submit(req, sink)?;
    respond(svc, model, form, n, ticket, rx, stream, include_usage, echo).await
}

/// `echo`: the prompt's text and its first token (whose log probability is null).
pub(crate) struct Echo {
    text: String,
    first: u32,
}

/// A prompt given as text or as token ids (`None`: absent or null).
pub(crate) fn text_prompt(
    svc: &RetainedService,
    v: Option<&Json>,
) -> Result<Option<Vec<u32>>, ApiError> {
    Ok(Some(match v {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::String(s)) => svc.encode(s)?,
        Some(Json::Array(a)) if a.iter().all(Json::is_u64) => a
            .iter()
            .map(|v| v.as_u64().unwrap_or(0).min(u64::from(u32::MAX)) as u32)
            .collect(),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`prompt` must be a string or an array of token ids (one prompt per request)",
            ));
        }
    }))
}

/// An event sink for the engine and the receiver the response reads.
pub(crate) fn event_channel() -> (
    serve_contracts::retained::EventSink,
    mpsc::UnboundedReceiver<Event>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let sink: serve_contracts::retained::EventSink = Arc::new(move |e| {
        let _ = tx.send(e);
    });
    (sink, rx)
}

/// The response to a submitted request, whole or streamed (the client going away cancels it).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn respond(
    svc: Arc<RetainedService>,
    model: String,
    form: Form,
    n: u32,
    ticket: Ticket,
    rx: mpsc::UnboundedReceiver<Event>,
    stream: bool,
    include_usage: bool,
    echo: Option<Echo>,
) -> Result<Response, ApiError> {
    let id = format!(
        "{}-{}",
        if form == Form::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    );
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let resp = Responder {
        form,
        id,
        model,
        created,
        n,
        svc,
        guard: Guard(Some(ticket)),
        echo,
    };
    if stream {
        Ok(resp.stream(rx, include_usage).into_response())
    } else {
        resp.whole(rx).await
    }
}

/// Cancels the request when the response is dropped before it finished (the client went away).
struct Guard(Option<Ticket>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.cancel();
        }
    }
}

impl Guard {
    fn finished(&mut self) -> u32 {
        self.0.take().map_or(0, |t| t.prompt_tokens)
    }
}

struct Responder {
    form: Form,
    id: String,
    model: String,
    created: u64,
    n: u32,
    svc: Arc<RetainedService>,
    guard: Guard,
    echo: Option<Echo>,
}

/// One choice's log probabilities, in the form's shape, accumulated token by token.
#[derive(Default)]
struct Logprobs {
    /// Chat: `[{token, logprob, bytes, top_logprobs}]`.
    content: Vec<Json>,
    /// Text: tokens, token_logprobs, top_logprobs.
    tokens: Vec<Json>,
    token_logprobs: Vec<Json>,
    top: Vec<Json>,
}

impl Responder {
    fn token_text(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = token_bytes(&self.svc.model, id);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    fn add_logprobs(&self, lp: &mut Logprobs, samples: &[Sample]) {
        for s in samples {
            let Some(l) = s.logprob else { continue };
            let (tok, bytes) = self.token_text(s.token);
            match self.form {
                Form::Chat => {
                    let top: Vec<Json> = s
                        .top
                        .iter()
                        .map(|&(id, l)| {
                            let (t, b) = self.token_text(id);
                            json!({"token": t, "logprob": l, "bytes": b})
                        })
                        .collect();
                    lp.content.push(
                        json!({"token": tok, "logprob": l, "bytes": bytes, "top_logprobs": top}),
                    );
                }
                Form::Text => {
                    let mut top = Map::new();
                    for &(id, l) in &s.top {
                        top.insert(self.token_text(id).0, json!(l));
                    }
                    lp.tokens.push(json!(tok));
                    lp.token_logprobs.push(json!(l));
                    lp.top.push(Json::Object(top));
                }
            }
        }
    }

    /// The prompt's log probabilities (`echo` with `logprobs`): the first token's entry (null), then the rest.
    fn add_prompt_logprobs(&self, lp: &mut Logprobs, samples: &[Sample]) {
        if let Some(e) = &self.echo {
            lp.tokens.push(json!(self.token_text(e.first).0));
            lp.token_logprobs.push(Json::Null);
            lp.top.push(Json::Null);
        }
        self.add_logprobs(lp, samples);
    }

    /// The echoed prompt text for a choice's first output (empty without `echo`).
    fn echo_text(&self) -> &str {
        self.echo.as_ref().map_or("", |e| e.text.as_str())
    }

    fn logprobs_json(&self, lp: &Logprobs, asked: bool) -> Json {
        if !asked {
            return Json::Null;
        }
        match self.form {
            Form::Chat => json!({"content": lp.content}),
            Form::Text => json!({
                "tokens": lp.tokens,
                "token_logprobs": lp.token_logprobs,
                "top_logprobs": lp.top,
            }),
        }
    }

    fn usage(&self, prompt: u32, completion: u32) -> Json {
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }

    /// The whole response once every choice is done.
    async fn whole(mut self, mut rx: mpsc::UnboundedReceiver<Event>) -> Result<Response, ApiError> {
        let n = self.n as usize;
        let mut text = vec![self.echo_text().to_string(); n];
        let mut lps: Vec<Logprobs> = (0..n).map(|_| Logprobs::default()).collect();
        let mut finish: Vec<Option<(Finish, u32)>> = vec![None; n];
        let mut asked = false;
        while finish.iter().any(Option::is_none) {
            match rx.recv().await {
                Some(Event::Prompt { index, samples }) => {
                    asked = true;
                    self.add_prompt_logprobs(&mut lps[index as usize], &samples);
                }
                Some(Event::Delta {
                    index,
                    text: t,
                    samples,
                }) => {
                    let i = index as usize;
                    text[i].push_str(&t);
                    asked |= samples.iter().any(|s| s.logprob.is_some());
                    self.add_logprobs(&mut lps[i], &samples);
                }
                Some(Event::Done {
                    index,
                    finish: f,
                    completion_tokens,
                }) => finish[index as usize] = Some((f, completion_tokens)),
                Some(Event::Failed(e)) => {
                    self.guard.finished();
                    return Err(ApiError::from(e));
                }
                None => {
                    return Err(ApiError::from(serve_runtime::Error::Internal(
                        "the model stopped before the response was complete".into(),
                    )));
                }
            }
        }
        let prompt = self.guard.finished();
        let completion: u32 = finish.iter().flatten().map(|f| f.1).sum();
        let choices: Vec<Json> = (0..n)
            .map(|i| {
                let (f, _) = finish[i].expect("every choice finished");
                let lp = self.logprobs_json(&lps[i], asked);
                match self.form {
                    Form::Chat => json!({
                        "index": i,
                        "message": {"role": "assistant", "content": text[i]},
                        "logprobs": lp,
                        "finish_reason": f.name(),
                    }),
                    Form::Text => json!({
                        "index": i,
                        "text": text[i],
                        "logprobs": lp,
                        "finish_reason": f.name(),
                    }),
                }
            })
            .collect();
        Ok(axum::Json(json!({
            "id": self.id,
            "object": if self.form == Form::Chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(prompt, completion),
        }))
        .into_response())
    }

    /// One chunk of a streamed response.
    fn chunk(&self, choices: Vec<Json>, usage: Option<Json>) -> SseEvent {
        let mut c = json!({
            "id": self.id,
            "object": if self.form == Form::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            c["usage"] = u;
        }
        SseEvent::default().data(c.to_string())
    }

    fn delta_choice(
        &self,
        index: u32,
        text: &str,
        lp: Json,
        finish: Option<Finish>,
        first: bool,
    ) -> Json {
        let f = finish.map_or(Json::Null, |f| json!(f.name()));
        match self.form {
            Form::Chat => {
                let mut delta = Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if !text.is_empty() || first {
                    delta.insert("content".into(), json!(text));
                }
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": f})
            }
            Form::Text => json!({"index": index, "text": text, "logprobs": lp, "finish_reason": f}),
        }
    }

    /// The streamed response: a chunk per engine event, then the usage chunk (when asked) and `[DONE]`.
    fn stream(
        self,
        rx: mpsc::UnboundedReceiver<Event>,
        include_usage: bool,
    ) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
        struct S {
            r: Responder,
            rx: mpsc::UnboundedReceiver<Event>,
            started: Vec<bool>,
            /// The choice's echoed prompt has been sent.
            echoed: Vec<bool>,
            done: Vec<bool>,
            completion: u32,
            include_usage: bool,
            tail: Vec<SseEvent>,
            over: bool,
        }
        let n = self.n as usize;
        let s = S {
            r: self,
            rx,
            started: vec![false; n],
            echoed: vec![false; n],
            done: vec![false; n],
            completion: 0,
            include_usage,
            tail: Vec::new(),
            over: false,
        };
        let stream = futures_util::stream::unfold(s, |mut s| async move {
            loop {
                if let Some(e) = s.tail.pop() {
                    return Some((Ok(e), s));
                }
                if s.over {
                    return None;
                }
                if s.done.iter().all(|d| *d) {
                    s.over = true;
                    let prompt = s.r.guard.finished();
                    let mut tail = vec![SseEvent::default().data("[DONE]")];
                    if s.include_usage {
                        tail.push(s.r.chunk(Vec::new(), Some(s.r.usage(prompt, s.completion))));
                    }
                    s.tail = tail;
                    continue;
                }
                match s.rx.recv().await {
                    Some(Event::Prompt { index, samples }) => {
                        let i = index as usize;
                        let mut l = Logprobs::default();
                        s.r.add_prompt_logprobs(&mut l, &samples);
                        let lp = s.r.logprobs_json(&l, true);
                        let first = !s.started[i];
                        s.started[i] = true;
                        s.echoed[i] = true;
                        let c = s.r.delta_choice(index, s.r.echo_text(), lp, None, first);
                        return Some((Ok(s.r.chunk(vec![c], None)), s));
                    }
                    Some(Event::Delta {
                        index,
                        text,
                        samples,
                    }) => {
                        let i = index as usize;
                        let first = !s.started[i];
                        s.started[i] = true;
                        let text = if s.echoed[i] {
                            text
                        } else {
                            s.echoed[i] = true;
                            format!("{}{text}", s.r.echo_text())
                        };
                        let asked = samples.iter().any(|x| x.logprob.is_some());
                        let lp = if asked {
                            let mut l = Logprobs::default();
                            s.r.add_logprobs(&mut l, &samples);
                            s.r.logprobs_json(&l, true)
                        } else {
                            Json::Null
                        };
                        if text.is_empty() && !first && !asked {
                            continue;
                        }
                        let c = s.r.delta_choice(index, &text, lp, None, first);
                        return Some((Ok(s.r.chunk(vec![c], None)), s));
                    }
                    Some(Event::Done {
                        index,
                        finish,
                        completion_tokens,
                    }) => {
                        let i = index as usize;
                        s.done[i] = true;
                        s.completion += completion_tokens;
                        let first = !s.started[i];
                        s.started[i] = true;
                        let text = if s.echoed[i] { "" } else { s.r.echo_text() };
                        s.echoed[i] = true;
                        let c =
                            s.r.delta_choice(index, text, Json::Null, Some(finish), first);
                        return Some((Ok(s.r.chunk(vec![c], None)), s));
                    }
                    Some(Event::Failed(e)) => {
                        s.over = true;
                        s.r.guard.finished();
                        let e = ApiError::from(e);
                        let body = json!({"error": {"message": e.message, "type": e.kind, "code": e.code}});
                        return Some((Ok(SseEvent::default().data(body.to_string())), s));
                    }
                    None => {
                        s.over = true;
                        let body = json!({"error": {
                            "message": "the model stopped before the response was complete",
                            "type": "server_error", "code": "internal_error"}});
                        return Some((Ok(SseEvent::default().data(body.to_string())), s));
                    }
                }
            }
        });
        Sse::new(stream).keep_alive(KeepAlive::default())
    }
}
