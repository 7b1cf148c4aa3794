// The Agent runs and Proposals pages in a real chromium: an Earth command
// run's detail (text, steps, matched entities, plan, copy of the run id),
// markup in titles and rationales shown as text, and the proposal policy:
// a super_admin applies a low-risk proposal at once, a normal admin is
// asked to confirm first, a secret-field proposal is shown rejected with
// its reason and cannot be applied; a viewer gets no buttons. Live, with
// no reload: an Earth command posted through the API appears in the list
// within 1 s and its detail turns completed when the (delayed) model
// answers; proposals applied or rejected by another admin change their
// cards.
//
// Env: BENCHLINK_URL, BENCHLINK_TOKEN (super_admin), ADMIN_TOKEN (admin),
// VIEWER_TOKEN,
// EARTH_RUN, EARTH_TEXT, MARKUP_RUN, PROPOSAL_RUN, MARKUP, PROPOSAL_AUTO,
// PROPOSAL_CONFIRM, PROPOSAL_SECRET, PROPOSAL_REJECT (pending, rejected
// here through the API), LIVE_EARTH_TEXT (a command the model answers
// after a few seconds).

import { run, openPage, signIn, screenshot, check, checkClean, env, http, BASE } from "./lib.mjs";

const card = (id) => `section.proposal[data-proposal-id="${id}"]`;

/** Mark the document; `unreloaded` is true while the mark is still there. */
const mark = (page) => page.evaluate(() => { window.__notReloaded = true; });
const unreloaded = (page) => page.evaluate(() => window.__notReloaded === true);

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

  await t.step("an Earth command posted through the API appears within 1 s, then completes, with no reload", async () => {
    await page.waitForFunction(() => document.querySelector("#stream-status")?.textContent.includes("live"), null, { timeout: 5_000 });
    await mark(page);
    const known = new Set(await page.$$eval("tr[data-run-id]", (l) => l.map((x) => x.dataset.runId)));
    const t0 = Date.now();
    // The model answers it after a few seconds: the answer comes later.
    const answer = http("POST", "/api/v1/agents/earth/command", env("BENCHLINK_TOKEN"), { input_text: env("LIVE_EARTH_TEXT"), source: "text" });
    const runId = await page.waitForFunction((k) => [...document.querySelectorAll("tr[data-run-id]")].map((x) => x.dataset.runId).find((id) => !k.includes(id)), [...known], { timeout: 1_000 }).then((h) => h.jsonValue());
    const ms = Date.now() - t0;
    const row = `tr[data-run-id="${runId}"]`;
    const txt = await page.textContent(row);
    check(txt.includes("earth_command") && txt.includes(env("LIVE_EARTH_TEXT")), `new row: ${txt}`);
    check(await page.getAttribute(row, "data-status") === "running", `status while the model thinks: ${await page.getAttribute(row, "data-status")}`);
    console.log(`     new run listed ${ms} ms after the request`);
    await page.click(`${row} a`);
    await page.waitForSelector('#run-id', { timeout: 3_000 });
    check(await page.textContent("#run-id") === runId, "the detail is the new run's");
    check(await page.getAttribute("#run-detail", "data-status") === "running", "the detail says running");
    await screenshot(page, "run-live-running");
    await page.waitForSelector('#run-detail[data-status="completed"]', { timeout: 15_000 });
    const done = await answer;
    check(done.status === 200 && done.json.run_id === runId, `the command's answer: ${done.status} ${JSON.stringify(done.json).slice(0, 200)}`);
    check(await page.$$eval(".llm-steps li", (l) => l.length) > 0, "the LLM step is listed once it ran");
    check((await page.textContent(".run-timeline")).includes("completed"), "the timeline ends completed");
    await page.click('a[href="#/runs"]');
    await page.waitForSelector(`${row}[data-status="completed"]`, { timeout: 3_000 });
    check(await unreloaded(page), "the page was reloaded");
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

  await t.step("a proposal rejected by another admin through the API changes its card without reload", async () => {
    const r = card(env("PROPOSAL_REJECT"));
    await page.waitForSelector(`${r}[data-status="pending"] button.reject`, { timeout: 5_000 });
    await mark(page);
    const t0 = Date.now();
    const out = await http("POST", `/api/v1/agents/proposals/${env("PROPOSAL_REJECT")}/reject`, env("ADMIN_TOKEN"), { reason: "not this quarter" });
    check(out.status === 200, `reject: ${out.status} ${JSON.stringify(out.json)}`);
    await page.waitForSelector(`${r}[data-status="rejected"]`, { timeout: 2_000 });
    console.log(`     rejected card shown ${Date.now() - t0} ms after the API call`);
    check((await page.textContent(`${r} .rejection`)).includes("not this quarter"), "the reason is shown");
    check(await page.$$(`${r} button.apply`).then((b) => b.length) === 0, "no Apply after the rejection");
    check(await unreloaded(page), "the page was reloaded");
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
    // The super_admin's page, open all along, follows the other admin's apply.
    await page.waitForSelector(`${b}[data-status="applied"]`, { timeout: 2_000 });
    check((await page.textContent(b)).includes("ada-admin"), "the applier is named on the other admin's page");
    check(await unreloaded(page), "the super_admin's page was reloaded");
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
