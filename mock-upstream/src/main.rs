//! `mock-upstream`: the loopback chat-completions server used by tests, benchmarks and the demo.

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use mock_upstream::window::Counting;
use mock_upstream::{MockMode, MockOptions};

#[derive(Parser)]
#[command(about = "Mock OpenAI-compatible upstream for tests, benchmarks and the demo")]
struct Cli {
    /// Address to listen on (port 0 picks a free one; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// chat | echo | summarizer | agent
    #[arg(long, default_value = "chat")]
    mode: String,
    /// Content chunks per streamed reply.
    #[arg(long, default_value_t = 8)]
    chunks: usize,
    /// Delay between streamed chunks, in milliseconds.
    #[arg(long, default_value_t = 0)]
    chunk_delay_ms: u64,
    /// Delay before the response starts, in milliseconds.
    #[arg(long, default_value_t = 0)]
    first_byte_delay_ms: u64,
    /// Skip OpenAI-style message validation.
    #[arg(long)]
    no_validate: bool,
    /// Recent requests kept for inspection (0 for benchmarks).
    #[arg(long, default_value_t = 0)]
    record: usize,
    /// A context window (the mock's own token count) refused with the provider's error.
    #[arg(long)]
    window: Option<u64>,
    /// Count input tokens with a real tokenizer (o200k, cl100k) instead of a quarter of the
    /// JSON length, for the window and the usage reported.
    #[arg(long, value_parser = |v: &str| Counting::parse(v).ok_or("o200k, cl100k or quarter"), default_value = "quarter")]
    tokenizer: Counting,
    /// Agent mode: tool steps before the final answer.
    #[arg(long, default_value_t = 30)]
    agent_steps: u32,
    /// Agent mode: the folder whose files the steps read.
    #[arg(long)]
    agent_files: Option<std::path::PathBuf>,
    /// Act as a Responses server without OpenAI's compaction contract (vLLM, SGLang…):
    /// `/responses/compact` is 404, a `compaction` input item is refused.
    #[arg(long)]
    without_native_compaction: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let Some(mode) = MockMode::parse(&cli.mode) else {
        eprintln!("mock-upstream: unknown --mode {}", cli.mode);
        return std::process::ExitCode::from(2);
    };
    let agent =
        match mock_upstream::agent::AgentScript::new(cli.agent_steps, cli.agent_files.as_deref()) {
            Ok(agent) => agent,
            Err(e) => {
                eprintln!("mock-upstream: --agent-files: {e}");
                return std::process::ExitCode::from(2);
            }
        };
    let options = MockOptions {
        agent,
        mode,
        chunks: cli.chunks,
        chunk_delay: Duration::from_millis(cli.chunk_delay_ms),
        first_byte_delay: Duration::from_millis(cli.first_byte_delay_ms),
        validate: !cli.no_validate,
        record: cli.record,
        window: cli.window,
        counting: cli.tokenizer,
        reported: mock_upstream::Reported::Whole,
        native_compaction: !cli.without_native_compaction,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("mock-upstream: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match mock_upstream::start(&cli.listen, options).await {
            Ok(handle) => {
                // Scripts and black-box tests wait for this exact line.
                let mut out = std::io::stdout();
                let _ = writeln!(out, "mock-upstream listening on http://{}", handle.addr);
                let _ = out.flush();
                wait_for_signal().await;
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mock-upstream: cannot listen on {}: {e}", cli.listen);
                std::process::ExitCode::FAILURE
            }
        }
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
