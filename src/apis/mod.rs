//! One folder per API, each a unit: its front-end (how its body reads as a conversation, the
//! planner's [`Dialect`], the path it serves, what its stream can carry) and the contracts
//! compactor serves for it ([`Contracts`]). [`Api`] is the registry: matched here and nowhere
//! else.

pub use crate::compaction::front_end::{ApiRequest, FrontEnd, Parsed};
use crate::compaction::planner::conversation::Dialect;
use crate::config::UpstreamApi;
use crate::provider::Provider;
use crate::served::Contracts;

pub mod chat;
pub mod gemini;
pub mod messages;
pub mod responses;
pub mod summarizer;
pub mod summary_wire;

/// The API a request speaks: it decides how the body is read and how the summary is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI's chat completions (`POST /v1/chat/completions`).
    ChatCompletions,
    /// OpenAI's Responses (`POST /v1/responses`).
    Responses,
    /// Anthropic's Messages (`POST /v1/messages`).
    Messages,
    /// Google's Gemini (`POST /v1beta/models/{model}:generateContent` and its other forms).
    Gemini,
}

impl Api {
    pub const ALL: [Api; 4] = [
        Api::ChatCompletions,
        Api::Responses,
        Api::Messages,
        Api::Gemini,
    ];

    pub fn front_end(self) -> &'static dyn FrontEnd {
        match self {
            Api::ChatCompletions => &chat::Chat,
            Api::Responses => &responses::Responses,
            Api::Messages => &messages::Messages,
            Api::Gemini => &gemini::Gemini,
        }
    }

    /// The API served at `path` (under the API prefix) for a POST.
    pub fn for_path(path: &str) -> Option<Api> {
        Api::ALL
            .into_iter()
            .find(|api| api.front_end().serves_path(path))
    }

    pub fn label(self) -> &'static str {
        self.front_end().label()
    }

    /// The contracts compactor serves for it, when it serves any.
    pub fn contracts(self) -> Option<&'static dyn Contracts> {
        match self {
            Api::ChatCompletions | Api::Gemini => None,
            Api::Responses => Some(&responses::served::ResponsesContracts),
            Api::Messages => Some(&messages::served::MessagesContracts),
        }
    }

    /// How it carries lookups of what a summary left out, when it does.
    pub fn retrieval(self) -> Option<&'static dyn crate::retrieval::Wire> {
        match self {
            Api::ChatCompletions => Some(&chat::retrieval::ChatRetrieval),
            Api::Messages => Some(&messages::retrieval::MessagesRetrieval),
            Api::Responses => Some(&responses::retrieval::ResponsesRetrieval),
            Api::Gemini => Some(&gemini::retrieval::GeminiRetrieval),
        }
    }

    /// The contracts served for a POST to `path` (under the API prefix).
    pub fn contracts_for(path: &str) -> Option<&'static dyn Contracts> {
        Api::ALL
            .into_iter()
            .filter_map(Api::contracts)
            .find(|contracts| contracts.serves(path))
    }

    /// A request of it whose body says all there is (the served contracts' own calls).
    pub fn body_request(self) -> ApiRequest {
        ApiRequest::of_body(self.front_end())
    }

    /// A POST of it to `path` (under the API prefix), read with what its path says.
    pub fn request_at(self, path: &str) -> ApiRequest {
        ApiRequest::at(self.front_end(), path)
    }

    /// The planner's view of it.
    pub fn dialect(self) -> &'static dyn Dialect {
        self.front_end()
    }
}

/// Every provider family, in the order paths are claimed: OpenAI's, which takes every path no
/// other claims, last.
const PROVIDERS: [&dyn Provider; 3] = [
    &messages::provider::Anthropic,
    &gemini::provider::Gemini,
    &chat::provider::OpenAi,
];

/// The wire of the upstreams with `api: family`.
pub fn provider(family: UpstreamApi) -> &'static dyn Provider {
    PROVIDERS
        .into_iter()
        .find(|provider| provider.family() == family)
        .unwrap_or(&chat::provider::OpenAi)
}

/// The family whose API a path under the listen prefix belongs to.
pub fn provider_for_path(rest: &str) -> &'static dyn Provider {
    PROVIDERS
        .into_iter()
        .find(|provider| provider.owns_path(rest))
        .unwrap_or(&chat::provider::OpenAi)
}

/// The family that claims a whole request path wherever the listen prefix is, if one does.
pub fn provider_claiming(path: &str) -> Option<&'static dyn Provider> {
    PROVIDERS
        .into_iter()
        .find(|provider| provider.claims_whole_path(path))
}
