// pisub's tool budget, loaded into a pi child (`pi -e <this file>`) when its run has one.
// Every tool call counts; past `hard`, the listed tools (default read, grep, find, ls; "*" all)
// are blocked with a clear reason, so the model finishes with what it has. Final text is never
// blocked. The budget comes from the environment: PISUB_TOOL_BUDGET={"hard":N,"block":[...]}.
export default function (pi: any) {
  let budget: any = null;
  try {
    budget = JSON.parse(process.env.PISUB_TOOL_BUDGET || "null");
  } catch {
    budget = null;
  }
  if (!budget || typeof budget.hard !== "number") return;
  const block: string[] = Array.isArray(budget.block) ? budget.block : ["read", "grep", "find", "ls"];
  let calls = 0;
  pi.on("tool_call", async (event: any) => {
    calls += 1;
    if (calls > budget.hard && (block.includes("*") || block.includes(event.toolName))) {
      return {
        block: true,
        reason:
          `blocked by the tool budget: ${budget.hard} tool calls were allowed and this is call ${calls}; ` +
          "finish your answer with what you have",
      };
    }
    return undefined;
  });
}
