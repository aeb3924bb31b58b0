// Validates rendered Kubernetes manifests offline: every object against the
// Kubernetes OpenAPI schema of its apiVersion and kind (the kubernetes-models
// npm package), with no field the schema does not name, then what tqkv's
// deployment promises (headless Service,
// non-root user and fsGroup, startup probe, grace period covering the
// shutdown deadline, disruption budget, image placeholder, per-pod data-plane
// address, GPU resources and tolerations, no committed Secret).
//
// Usage: node validate.mjs MODULES_DIR OVERLAY RENDERED.yaml
//   MODULES_DIR  node_modules holding kubernetes-models and js-yaml
//   OVERLAY      cpu, gpu or gpu-tls (what the overlay must hold)
// Prints one line per object and per failed check; exits 1 on any failure.
// `node validate.mjs MODULES_DIR --self-test` checks that a valid object
// passes and broken ones are refused (so a passing run means something).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, overlay, file] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(join(modules, p)).href);
const yaml = (await load("js-yaml/index.js")).default;

// apiVersion "group/version" or "version" -> the models' directory.
async function model(apiVersion, kind) {
  const dir = apiVersion.includes("/") ? apiVersion : `v1`;
  try {
    const m = await load(`kubernetes-models/${dir}/${kind}.js`);
    return m[kind];
  } catch (e) {
    return null;
  }
}

// Strictness (what kubeconform -strict adds): the OpenAPI schemas allow
// unknown fields, so a misspelled one would pass and be dropped by the API
// server. The models' type declarations (.d.ts) list each object's fields;
// every field of a rendered object must be one of them, recursively (types
// written inline, such as the StatefulSet's volumeClaimTemplates, are not
// descended into).
const interfaces = new Map();  // .d.ts path -> {props: Map(name -> type), imports: Map(type -> path)}
function declarations(file) {
  if (interfaces.has(file)) return interfaces.get(file);
  const text = readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/^import \{ (\w+) \} from "([^"]+)";$/gm)) {
    const spec = m[2].replace(/\.js$/, "");
    const path = spec.startsWith(".") ? join(file, "..", spec) : join(modules, spec);
    imports.set(m[1], `${path}.d.ts`);
  }
  const props = new Map();
  const body = text.match(/^export interface \w+(?: extends (\w+))? \{\n([\s\S]*?)^\}/m);
  if (body) {
    if (body[1] === "TypeMeta") ["apiVersion", "kind"].forEach((k) => props.set(k, "string"));
    // `"name"?: Type;` (a map type opens `{` and continues on later lines).
    for (const m of body[2].matchAll(/^    "([^"]+)"\??: (.*)$/gm)) props.set(m[1], m[2].replace(/;$/, ""));
  }
  const d = {props, imports};
  interfaces.set(file, d);
  return d;
}
function strict(value, file, path) {
  if (value === null || typeof value !== "object") return;
  const d = declarations(file);
  if (d.props.size === 0) return;  // not a plain object type (IntOrString, Quantity, ...)
  for (const [key, v] of Object.entries(value)) {
    if (!d.props.has(key)) {
      fail(`${path}.${key}: unknown field`);
      continue;
    }
    const type = d.props.get(key).replace(/^Array<(.*)>$/, "$1");
    if (!d.imports.has(type)) continue;  // a primitive, a literal union or a map
    for (const item of Array.isArray(v) ? v : [v]) strict(item, d.imports.get(type), `${path}.${key}`);
  }
}

let failures = 0;
const fail = (msg) => {
  failures++;
  console.log(`FAIL ${msg}`);
};

async function validateObject(obj) {
  const Model = await model(obj.apiVersion, obj.kind);
  const name = `${obj.apiVersion} ${obj.kind} ${obj.metadata?.namespace ?? "-"}/${obj.metadata?.name}`;
  if (Model === null) {
    fail(`${name}: no schema for this apiVersion and kind`);
    return;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    fail(`${name}: ${e.message}`);
    return;
  }
  const dir = obj.apiVersion.includes("/") ? obj.apiVersion : "v1";
  const before = failures;
  strict(obj, join(modules, "kubernetes-models", dir, `${obj.kind}.d.ts`), name);
  if (failures === before) console.log(`ok   ${name}`);
}

if (overlay === "--self-test") {
  const sts = (spec) => ({
    apiVersion: "apps/v1", kind: "StatefulSet", metadata: {name: "x"},
    spec: {serviceName: "x", selector: {matchLabels: {a: "b"}},
           template: {metadata: {labels: {a: "b"}}, spec: {containers: [{name: "c"}]}}, ...spec},
  });
  await validateObject(sts({}));
  const good = failures === 0;
  await validateObject(sts({replicas: "three"}));
  const wrongType = failures === 1;
  const typo = sts({});
  typo.spec.template.spec.containers[0].securityContext = {runAsUsr: 10001};
  await validateObject(typo);
  if (good && wrongType && failures === 2) {
    console.log("self-test: a valid StatefulSet passes; replicas \"three\" and a misspelled field are refused");
    process.exit(0);
  }
  console.log("self-test: the validator judged these objects wrongly");
  process.exit(1);
}

const docs = yaml.loadAll(readFileSync(file, "utf8")).filter((d) => d != null);
for (const d of docs) await validateObject(d);

const find = (kind, name) => docs.find((d) => d.kind === kind && (!name || d.metadata.name === name));
const expect = (cond, msg) => {
  if (!cond) fail(msg);
};

expect(!docs.some((d) => d.kind === "Secret"), "a Secret is rendered: tokens must not be committed");
const sts = find("StatefulSet", "tqkv");
const headless = find("Service", "tqkv-headless");
const pdb = find("PodDisruptionBudget");
expect(sts && headless && pdb && find("Service", "tqkv") && find("Namespace"),
       "StatefulSet tqkv, Services tqkv and tqkv-headless, a PodDisruptionBudget and the Namespace");
if (sts && headless && pdb) {
  const pod = sts.spec.template.spec;
  const labels = sts.spec.template.metadata.labels;
  const selects = (sel) => Object.entries(sel).every(([k, v]) => labels[k] === v);
  expect(headless.spec.clusterIP === "None", "tqkv-headless has no cluster IP (per-pod DNS)");
  const ports = Object.fromEntries(headless.spec.ports.map((p) => [p.name, p.port]));
  expect(ports.grpc === 50051 && ports.data === 50052, "tqkv-headless exposes grpc and data");
  expect(selects(headless.spec.selector), "tqkv-headless selects the pods");
  expect(sts.spec.serviceName === "tqkv-headless", "the StatefulSet's pods are named under tqkv-headless");
  expect(selects(pdb.spec.selector.matchLabels) && pdb.spec.maxUnavailable === 1,
         "the PodDisruptionBudget selects the pods and allows one down");

  const sc = pod.securityContext ?? {};
  expect(sc.runAsUser === 10001 && sc.runAsGroup === 10001 && sc.fsGroup === 10001 && sc.runAsNonRoot === true,
         "pods run as uid/gid 10001, non-root, with fsGroup 10001");
  const server = pod.containers.find((c) => c.name === "tqkv");
  for (const c of [...pod.containers, ...(pod.initContainers ?? [])]) {
    const csc = c.securityContext ?? {};
    expect(csc.readOnlyRootFilesystem === true && csc.allowPrivilegeEscalation === false &&
           (csc.capabilities?.drop ?? []).includes("ALL") && csc.runAsUser === undefined,
           `container ${c.name}: read-only root, no privilege escalation, no capabilities, the pod's user`);
    expect(/^registry\.invalid\/tqkv:[0-9][^:]*$/.test(c.image) && !c.image.endsWith(":latest"),
           `container ${c.name}: image registry.invalid/tqkv:VERSION (placeholder registry), not ${c.image}`);
  }
  expect(server.startupProbe && server.startupProbe.periodSeconds * server.startupProbe.failureThreshold >= 300,
         "the server has a startup probe allowing at least 5 minutes");
  expect(server.livenessProbe && server.livenessProbe.initialDelaySeconds === undefined,
         "liveness waits for the startup probe, not a fixed delay");
  const arg = (flag) => {
    const a = server.args.find((x) => x.startsWith(`--${flag}=`));
    return a === undefined ? undefined : a.slice(flag.length + 3);
  };
  const preStop = server.lifecycle?.preStop?.exec?.command;
  const preStopSeconds = preStop && preStop[0] === "sleep" ? Number(preStop[1]) : 0;
  const needed = preStopSeconds + Number(arg("shutdown_grace_ms")) / 1000 +
                 Number(arg("shutdown_spill_deadline_ms")) / 1000 + 10;
  expect(pod.terminationGracePeriodSeconds >= needed,
         `terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} covers preStop + drain + spill + 10 s (${needed})`);
  expect(arg("data_advertise_host") === "$(POD_IP)" &&
         server.env.some((e) => e.name === "POD_IP" && e.valueFrom?.fieldRef?.fieldPath === "status.podIP"),
         "the data plane is advertised at the pod's own IP");
  expect(arg("auth_tokens_file") !== undefined, "auth is on");
  const gpus = server.resources?.limits?.["nvidia.com/gpu"];
  const tolerates = (pod.tolerations ?? []).some((t) => t.key === "nvidia.com/gpu" && t.effect === "NoSchedule");
  if (overlay === "cpu") {
    expect(arg("backend") === "cpu" && gpus === undefined && !tolerates,
           "cpu: the cpu backend, no GPU resource or toleration");
  } else {
    expect(arg("backend") === "cuda" && Number(gpus) === 1 && tolerates,
           `${overlay}: the cuda backend, one nvidia.com/gpu, the GPU taint tolerated`);
  }
  if (overlay === "gpu-tls") {
    expect(arg("tls_cert_file") && arg("tls_key_file") && arg("tls_client_ca_file"),
           "gpu-tls: TLS certificate, key and client CA");
    expect(["startupProbe", "readinessProbe", "livenessProbe"].every((p) => server[p].tcpSocket && !server[p].grpc),
           "gpu-tls: TCP probes (Kubernetes' gRPC probes speak plaintext)");
  } else {
    expect(server.readinessProbe.grpc?.port === 50051, "gRPC readiness probe");
  }
}

console.log(`${overlay}: ${docs.length} objects, ${failures} failures`);
process.exit(failures === 0 ? 0 : 1);
