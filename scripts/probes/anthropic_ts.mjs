// Which notice forms the official TypeScript SDK (@anthropic-ai/sdk) tolerates on a compacted
// Messages stream: `messages.create({stream: true})` and the `messages.stream()` helper, one
// summarized request per form. Run by scripts/probes/anthropic_ts.sh; prints one line per case.
import Anthropic from "@anthropic-ai/sdk";

const base = process.env.COMPACTOR_URL;
let run = 0;
function messages() {
  run += 1;
  const out = [{ role: "user", content: `run ${run}: fix the bug` }];
  for (let i = 0; i < 4; i++) {
    const id = `toolu_ts_${run}_${i}`;
    out.push({ role: "assistant", content: [{ type: "text", text: "reading" }, { type: "tool_use", id, name: "Read", input: { file_path: "a.rs" } }] });
    out.push({ role: "user", content: [{ type: "tool_result", tool_use_id: id, content: "fn main() {}" }] });
  }
  return out;
}
const tools = [{ name: "Read", description: "read", input_schema: { type: "object" } }];
const request = () => ({ model: "claude-sonnet-4-5", max_tokens: 100, tools, messages: messages() });

for (const mode of ["comment", "named", "off"]) {
  const client = new Anthropic({ baseURL: base, apiKey: "sk-ant-probe", maxRetries: 0, defaultHeaders: { "x-compactor-notice": mode } });
  try {
    const { data, response } = await client.messages.create({ ...request(), stream: true }).withResponse();
    const kinds = [];
    for await (const event of data) kinds.push(event.type);
    console.log(`${mode} create(stream) ${response.headers.get("x-compactor-compaction")}: ok, first ${kinds[0]}, last ${kinds.at(-1)}`);
  } catch (e) {
    console.log(`${mode} create(stream): FAILS ${e.constructor.name}: ${e.message}`);
  }
  try {
    const stream = client.messages.stream(request());
    let text = "";
    stream.on("text", (delta) => { text += delta; });
    const final = await stream.finalMessage();
    console.log(`${mode} stream() helper: ok, text ${JSON.stringify(text)}, final ${final.content[0].type}`);
  } catch (e) {
    console.log(`${mode} stream() helper: FAILS ${e.constructor.name}: ${e.message}`);
  }
}
