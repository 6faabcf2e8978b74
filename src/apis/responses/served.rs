//! OpenAI's compaction contracts on `/responses`, as one phase before the upstream call: the
//! compact endpoint and a request ending with a trigger are answered here; compactor's own
//! items are expanded; `context_management` is served ([`super::managed`]).

use bytes::Bytes;
use serde_json::Value;

use super::compact::{compact, compact_on_trigger, ends_with_trigger, expand, COMPACT_PATH};
use super::managed::{self, Managed};
use crate::body::ProxyBody;
use crate::served::{Addition, Ask, Before, BeforeFuture, Contracts};

pub struct ResponsesContracts;

impl Contracts for ResponsesContracts {
    fn serves(&self, rest: &str) -> bool {
        rest == "/responses" || rest == COMPACT_PATH
    }

    fn before<'a>(&'a self, ask: Ask<'a>, rest: &'a str, body: &'a Bytes) -> BeforeFuture<'a> {
        Box::pin(async move {
            if rest == COMPACT_PATH {
                let (body, outcome) = compact(&ask, body).await?;
                return Ok(Before::Answered {
                    body,
                    streamed: false,
                    outcome,
                });
            }
            // The client's copy of a compaction compactor made becomes what it carries.
            let expanded = expand(body, ask.sealer, &ask.binding())?;
            let current = expanded.as_ref().unwrap_or(body);
            if ends_with_trigger(current) {
                let (body, streamed, outcome) = compact_on_trigger(&ask, current).await?;
                return Ok(Before::Answered {
                    body,
                    streamed,
                    outcome,
                });
            }
            Ok(match managed::serve(&ask, current).await? {
                Managed::Untouched => match expanded {
                    Some(expanded) => Before::Rewritten(expanded, None),
                    None => Before::Forward,
                },
                Managed::Stripped(body) => Before::Rewritten(body, None),
                Managed::Compacted {
                    body,
                    outcome,
                    item,
                } => Before::Compacted(body, outcome, Some(Box::new(CompactionItem(item)))),
                Managed::Unsummarized { body, outcome } => Before::Compacted(body, outcome, None),
            })
        })
    }
}

/// OpenAI's `compaction` output item, first in the answer.
struct CompactionItem(Value);

impl Addition for CompactionItem {
    fn splice_stream(&self, stream: ProxyBody) -> ProxyBody {
        managed::spliced_stream(stream, &self.0)
    }

    fn splice_whole(&self, whole: &[u8]) -> Option<Bytes> {
        managed::splice_into_response(whole, &self.0)
    }
}
