//! Arbitrary bodies through the parser, the planner and the rewrite: nothing may panic, and
//! any rewrite that is produced must validate.
#![no_main]

use compactor::compaction::conversation::Conversation;
use compactor::compaction::plan::{plan, Decision, NoCache, PlanSettings};
use compactor::compaction::rewrite::{rewrite, summary_message};
use compactor::compaction::summary_input::{self, InputSettings};
use compactor::compaction::tokens::TokenModel;
use compactor::config::{ContextSize, Oversize, SummarizationConfig, SummaryRole};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(conversation) = Conversation::parse(data) else {
        return;
    };
    let base = PlanSettings::from_config(&SummarizationConfig::default());
    for (trigger, keep) in [
        (ContextSize::Messages(1), ContextSize::Messages(1)),
        (ContextSize::Tokens(1), ContextSize::Tokens(5)),
        (ContextSize::Fraction(0.1), ContextSize::Fraction(0.5)),
    ] {
        let settings = PlanSettings { triggers: vec![trigger], keep, ..base.clone() };
        let model = TokenModel { max_input_tokens: Some(100), ..TokenModel::default() };
        let planned = plan(&conversation, &settings, &model, false, &mut NoCache);
        if let Decision::Summarize { layout, to_summarize, .. } = planned.decision {
            let entries = summary_input::transcript_entries(&conversation, &to_summarize);
            let input = summary_input::build(entries, None, &InputSettings {
                budget: Some(50),
                oversize: Oversize::Fold,
                model,
            });
            assert!(!input.chunks.is_empty());
            rewrite(&conversation, &layout, &summary_message("s", SummaryRole::User))
                .expect("a planned layout always rewrites");
        }
    }
});
