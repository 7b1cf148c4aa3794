// The Agent runs and Proposals pages in a real chromium: an Earth command
// run's detail (text, steps, matched entities, plan, copy of the run id),
// markup in titles and rationales shown as text, and the proposal policy:
// a super_admin applies a low-risk proposal at once, a normal admin is
// asked to confirm first, a secret-field proposal is shown rejected with
// its reason and cannot be applied; a viewer gets no buttons.
//
// Env: BENCHLINK_URL, BENCHLINK_TOKEN (super_admin), ADMIN_TOKEN (admin),
// VIEWER_TOKEN,
// EARTH_RUN, EARTH_TEXT, MARKUP_RUN, PROPOSAL_RUN, MARKUP, PROPOSAL_AUTO,
// PROPOSAL_CONFIRM, PROPOSAL_SECRET.

import { run, openPage, signIn, screenshot, check, checkClean, env, http, BASE } from "./lib.mjs";

const card = (id) => `section.proposal[data-proposal-id="${id}"]`;

run("runs", async (t) => {
  const markup = env("MARKUP");
  await t.context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: new URL(BASE()).origin });
  const { page, watch } = await openPage(t.context);

  await t.step("sign in on the runs page", () => signIn(page, env("BENCHLINK_TOKEN"), "#/runs"));

  await t.step("the list shows runs with type, title and creator; markup titles as text", async () => {
    await page.waitForSelector(`tr[data-run-id="${env("EARTH_RUN")}"]`, { timeout: 10_000 });
    const row = await page.textContent(`tr[data-run-id="${env("EARTH_RUN")}"]`);
    check(row.includes("earth_command") && row.includes("completed"), `row: ${row}`);
    const title = await page.textContent(`tr[data-run-id="${env("MARKUP_RUN")}"] .run-title`);
    check(title.includes(markup), `title as text: ${title}`);
    await screenshot(page, "runs");
  });

  await t.step("an Earth command run shows its text, steps, entities and plan", async () => {
    await page.goto(`${BASE()}/console/#/runs/${env("EARTH_RUN")}`);
    await page.waitForSelector(".earth .earth-text", { timeout: 10_000 });
    check((await page.textContent(".earth .earth-text")).includes(env("EARTH_TEXT")), "the command text");
    const tools = await page.$$eval(".tool-steps li", (l) => l.map((x) => x.dataset.stepName));
    check(tools.length > 0 && tools.includes("earth.find_entities"), `tool steps: ${tools}`);
    const other = await page.$$eval(".other-steps li", (l) => l.map((x) => x.dataset.stepName));
    check(other.includes("earth.plan_validation") && other.includes("earth.action_plan"), `policy/action steps: ${other}`);
    const plan = await page.$$eval(".plan-action", (l) => l.map((x) => x.dataset.actionType));
    check(plan.includes("highlight_entities"), `plan: ${plan}`);
    check(await page.$$eval(".entities tbody tr", (r) => r.length) > 0, "matched entities listed");
    check(await page.$$eval(".plan-action", (l) => l.map((x) => x.textContent).join(" ")).then((t) => t.includes("entities")), "the plan says how many entities");
    check(await page.$$eval(".run-timeline li", (r) => r.length) >= 3, "status timeline");
    await screenshot(page, "run-earth");
  });

  await t.step("the run id is copied", async () => {
    await page.click("#copy-run-id");
    await page.waitForSelector("#copy-run-id[data-copied]", { timeout: 3_000 });
    const how = await page.getAttribute("#copy-run-id", "data-copied");
    if (how === "true") {
      const got = await page.evaluate(() => navigator.clipboard.readText());
      check(got === env("EARTH_RUN"), `clipboard: ${got}`);
    } else {
      const got = await page.evaluate(() => String(window.getSelection()));
      check(got === env("EARTH_RUN"), `selection: ${got}`);
    }
  });

  await t.step("a proposal run shows its proposals", async () => {
    await page.goto(`${BASE()}/console/#/runs/${env("PROPOSAL_RUN")}`);
    await page.waitForSelector(card(env("PROPOSAL_SECRET")), { timeout: 10_000 });
    check(await page.$$eval(".llm-steps li", (l) => l.length) > 0, "LLM steps listed");
    await screenshot(page, "run-proposals");
  });

  await t.step("super_admin: the proposals page; a secret-field proposal is rejected with its reason", async () => {
    await page.goto(`${BASE()}/console/#/proposals`);
    const s = card(env("PROPOSAL_SECRET"));
    await page.waitForSelector(s, { timeout: 10_000 });
    check(await page.getAttribute(s, "data-status") === "rejected", "secret proposal status");
    const why = await page.textContent(`${s} .rejection`);
    check(why.includes("secret fields") && why.includes("api_key"), `rejection: ${why}`);
    check(await page.$$(`${s} button.apply`).then((b) => b.length) === 0, "no Apply on a rejected proposal");
    check(!(await page.textContent(s)).includes("sk-live"), "the secret is not shown");
    const rationale = await page.textContent(`${card(env("PROPOSAL_AUTO"))} .rationale`);
    check(rationale.includes(markup), `rationale as text: ${rationale}`);
    check((await page.textContent(`${card(env("PROPOSAL_AUTO"))} .diff-table`)).includes("text"), "the diff names the changed field");
    await screenshot(page, "proposals");
  });

  await t.step("super_admin applies a low-risk proposal without a confirmation", async () => {
    const a = card(env("PROPOSAL_AUTO"));
    await page.click(`${a} button.apply`);
    await page.waitForSelector(`${card(env("PROPOSAL_AUTO"))}[data-status="applied"]`, { timeout: 10_000 });
    check(await page.$$(`${a} .confirm`).then((x) => x.length) === 0, "no confirmation asked");
    const list = await http("GET", "/api/v1/agents/proposals", env("BENCHLINK_TOKEN"));
    const p = list.json.proposals.find((x) => String(x.id) === env("PROPOSAL_AUTO"));
    check(p.status === "applied" && p.policy_result.applied_mode === "auto", `server: ${JSON.stringify(p.policy_result)}`);
  });

  const admin = await openPage(t.context);
  await t.step("a normal admin is asked to confirm, then applies", async () => {
    await signIn(admin.page, env("ADMIN_TOKEN"), "#/proposals");
    const b = card(env("PROPOSAL_CONFIRM"));
    await admin.page.waitForSelector(`${b} button.apply`, { timeout: 10_000 });
    await admin.page.click(`${b} button.apply`);
    await admin.page.waitForSelector(`${b} .confirm`, { timeout: 3_000 });
    const before = await http("GET", "/api/v1/agents/proposals", env("ADMIN_TOKEN"));
    check(before.json.proposals.find((x) => String(x.id) === env("PROPOSAL_CONFIRM")).status === "pending", "nothing applied before the confirmation");
    await screenshot(admin.page, "proposal-confirm");
    await admin.page.click(`${b} button.confirm-apply`);
    await admin.page.waitForSelector(`${b}[data-status="applied"]`, { timeout: 10_000 });
    const after = await http("GET", "/api/v1/agents/proposals", env("ADMIN_TOKEN"));
    const p = after.json.proposals.find((x) => String(x.id) === env("PROPOSAL_CONFIRM"));
    check(p.status === "applied" && p.policy_result.applied_mode === "manual", `server: ${JSON.stringify(p.policy_result)}`);
  });

  const viewer = await openPage(t.context);
  await t.step("a viewer sees no Apply or Reject, and a forged reject is refused", async () => {
    await signIn(viewer.page, env("VIEWER_TOKEN"), "#/proposals");
    await viewer.page.waitForFunction(() => document.querySelector("main .error")?.textContent.includes("may not see proposals"), null, { timeout: 10_000 });
    check(await viewer.page.$$eval("button.apply, button.reject, button.confirm-apply", (b) => b.length) === 0, "no action buttons for a viewer");
    await viewer.page.goto(`${BASE()}/console/#/runs/${env("PROPOSAL_RUN")}`);
    await viewer.page.waitForSelector(".proposals section.proposal", { timeout: 10_000 });
    check(await viewer.page.$$eval("button.apply, button.reject", (b) => b.length) === 0, "no proposal buttons on the run page");
    const forged = await http("POST", `/api/v1/agents/proposals/${env("PROPOSAL_CONFIRM")}/reject`, env("VIEWER_TOKEN"), { reason: "forged" });
    check(forged.status === 403, `forged reject: ${forged.status}`);
  });

  checkClean(watch, "runs pages (super_admin)");
  checkClean(viewer.watch, "pages (viewer)");
  checkClean(admin.watch, "proposals page (admin)");
});
