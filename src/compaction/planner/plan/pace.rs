//! A conversation's growth per request, learned from the requests compactor has seen of it.
//!
//! The history alone tells how much a conversation grows per model response, not per request:
//! a client that sends one request per user turn, whose answer holds several responses, grows
//! by all of them between two requests. Each request over a trigger leaves a record under the
//! digest of its whole message list; the next request of the conversation starts with those
//! messages, so it finds the record under one of its own prefixes and measures what the client
//! added since. A record under another conversation's prefix is never found (the chain digests
//! every message before it), and a request sent again (a retry) finds its own record and
//! measures nothing.

use crate::compaction::planner::digest::Digest;

/// Steps averaged for a conversation's growth: recent enough to follow a change of pace
/// (an agent moving from chat to reading files), enough to smooth one large tool output.
pub const GROWTH_STEPS: usize = 8;

/// The longest step back, in messages, at which the previous request's record is looked for:
/// more messages than a request adds (a user turn with a few dozen calls and results).
const PACE_PROBES: usize = 64;

/// What compactor remembers of a conversation as of one request: the request's size and the
/// mean growth per request over the latest requests before it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pace {
    pub tokens: u64,
    pub messages: u64,
    /// Unrounded: a mean kept in whole units would never move by less than half a unit
    /// times the samples (a pace of 4 messages stays 4 while every request adds 3).
    growth_tokens: f64,
    growth_messages: f64,
    /// Requests the mean is over (at most [`GROWTH_STEPS`]); none before the second request.
    samples: u64,
}

/// The record a plan leaves for the conversation's next request: `pace` under `key` (the
/// digest of the request's messages), in place of the record it learned from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaceRecord {
    pub key: Digest,
    pub pace: Pace,
    pub superseded: Option<Digest>,
}

impl Pace {
    /// The growth per request it has measured (tokens, messages), once it has measured one.
    pub fn per_request(&self) -> Option<(u64, u64)> {
        (self.samples > 0).then(|| {
            (
                self.growth_tokens.round() as u64,
                self.growth_messages.round() as u64,
            )
        })
    }

    /// This request's record, from the previous request's (`before`, if compactor saw it).
    fn after(before: Option<Pace>, tokens: u64, messages: u64) -> Pace {
        let Some(before) = before else {
            return Pace {
                tokens,
                messages,
                ..Pace::default()
            };
        };
        // A mean over the first requests, then weighted 1 / GROWTH_STEPS to the newest, so
        // the pace follows a change (an agent moving from chat to reading files) while one
        // large output is smoothed.
        let samples = (before.samples + 1).min(GROWTH_STEPS as u64);
        let mean = |old: f64, sample: u64| old + (sample as f64 - old) / samples as f64;
        Pace {
            tokens,
            messages,
            growth_tokens: mean(before.growth_tokens, tokens.saturating_sub(before.tokens)),
            growth_messages: mean(
                before.growth_messages,
                messages.saturating_sub(before.messages),
            ),
            samples,
        }
    }
}

/// The record for a request of `tokens` whose prefix chain is `chain`, learned from the latest
/// record (`recorded`) among its prefixes after the pinned `head`. The request's own record
/// (it was sent before) stands as it is.
pub fn learn(
    chain: &[Digest],
    head: usize,
    tokens: u64,
    recorded: &mut dyn FnMut(&Digest) -> Option<Pace>,
) -> PaceRecord {
    let n = chain.len() - 1;
    let key = chain[n];
    if let Some(pace) = recorded(&key) {
        return PaceRecord {
            key,
            pace,
            superseded: None,
        };
    }
    let previous = (head + 1..n).rev().take(PACE_PROBES).find_map(|k| {
        recorded(&chain[k])
            .filter(|pace| pace.tokens < tokens)
            .map(|pace| (chain[k], pace))
    });
    PaceRecord {
        key,
        pace: Pace::after(previous.map(|(_, pace)| pace), tokens, n as u64),
        superseded: previous.map(|(key, _)| key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_follows_the_latest_requests() {
        let mut pace = Pace::after(None, 1_000, 10);
        assert_eq!(pace.per_request(), None);
        for request in 1..=20u64 {
            pace = Pace::after(Some(pace), 1_000 + request * 300, 10 + request * 4);
        }
        assert_eq!(pace.per_request(), Some((300, 4)));
        assert_eq!(pace.samples, GROWTH_STEPS as u64);
        // A change of pace is more than half taken over within GROWTH_STEPS requests.
        for _ in 0..GROWTH_STEPS {
            pace = Pace::after(Some(pace), pace.tokens + 1_200, pace.messages + 2);
        }
        assert!(pace.growth_tokens > 750.0, "{pace:?}");
    }

    #[test]
    fn a_pace_below_its_mean_by_less_than_a_unit_a_sample_is_still_followed() {
        // 4 messages a request, then 3: a mean rounded to whole messages at each step stays 4.
        let mut pace = Pace::after(None, 0, 0);
        for request in 1..=GROWTH_STEPS as u64 {
            pace = Pace::after(Some(pace), request * 100, request * 4);
        }
        for _ in 0..4 * GROWTH_STEPS {
            pace = Pace::after(Some(pace), pace.tokens + 100, pace.messages + 3);
        }
        assert_eq!(pace.per_request(), Some((100, 3)));
    }
}
