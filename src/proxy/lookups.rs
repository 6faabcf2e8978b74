//! The phase that offers a compacted request lookups of what its summary left out
//! (`summarization.retrieval`), and the rounds they cost after the upstream's answer.

use std::sync::Arc;

use bytes::Bytes;
use http::header;

use super::compacting::Compacting;
use super::facts::Facts;
use super::Outgoing;
use crate::access_log::RequestLog;
use crate::app::Current;
use crate::body;
use crate::compaction::OutcomeKind;
use crate::config::RetrievalConfig;
use crate::retrieval::{self, Rounds, Tally};

/// The caller's retrieval settings: its key's own, else the default.
fn settings<'c>(current: &'c Current, facts: &Facts<'_>) -> &'c RetrievalConfig {
    let config = &current.generation.config;
    facts
        .key
        .and_then(|key| config.auth.keys.iter().find(|k| k.name == key.name))
        .and_then(|key| key.retrieval.as_ref())
        .unwrap_or(&config.summarization.retrieval)
}

/// A summarized or reused request with the index and the tool in its body, and what its
/// lookups will need; None (the body untouched) when retrieval is off for the caller, or the
/// request carries no summary, or its API or body cannot carry the tool.
pub(super) fn offer(
    current: &Current,
    facts: &Facts<'_>,
    compacting: &mut Compacting<'_>,
    outgoing: &mut Outgoing<'_>,
    log: &mut RequestLog,
) -> Option<Rounds> {
    let settings = settings(current, facts);
    let wire = facts.retrieval.filter(|_| settings.enabled)?;
    let at = outgoing
        .target
        .uri
        .path_and_query()
        .map_or("", |p| p.as_str());
    if !wire.offers_at(at) {
        return None;
    }
    let compacted = compacting.compacted.as_mut()?;
    let summarized = matches!(
        compacted.outcome.kind,
        OutcomeKind::Summarized | OutcomeKind::Reused
    );
    let summary = compacted.summary.as_deref().filter(|_| summarized)?;
    let original = compacting.original.as_ref()?;
    let prepared = retrieval::prepare(
        wire,
        settings,
        original,
        &compacted.body,
        (summary, &compacted.covered),
    )?;
    compacted.body = prepared.body.clone();
    compacting.body = body::full(prepared.body.clone());
    // The answer is read for the model's lookups: it must come back as plain text.
    outgoing.headers.remove(header::ACCEPT_ENCODING);
    let tally = Arc::new(Tally::default());
    log.expansions = Some(tally.clone());
    Some(Rounds {
        wire,
        settings: settings.clone(),
        upstreams: current.upstreams.clone(),
        upstream: outgoing.target.upstream.name.clone(),
        method: outgoing.target.method.clone(),
        uri: outgoing.target.uri.clone(),
        headers: outgoing.headers.clone(),
        body: prepared.body,
        plain: prepared.plain,
        refs: prepared.refs,
        tally,
    })
}

/// Whether the body sent is still `offered`, the one the lookups were offered on (a retry
/// after a context-length error compacts again, without the tool).
pub(super) fn still_offered(offered: &Bytes, sent: Option<&Bytes>) -> bool {
    sent.is_some_and(|body| body == offered)
}
