// Submit form: show only the chosen kind's fields, offer only the settings the chosen
// benchmark can run, and point the example scores link at the chosen benchmark.
(() => {
  const form = document.getElementById("submit-form");
  if (!form) return;
  const kind = form.querySelector("[name=kind]");
  const benchmark = form.querySelector("[name=benchmark]");
  const supported = JSON.parse(document.getElementById("benchmark-settings").textContent);
  const example = document.getElementById("example-scores");
  const note = document.getElementById("settings-note");

  const showKind = () => {
    form.querySelectorAll("[data-kinds]").forEach((box) => {
      const used = box.dataset.kinds.split(" ").includes(kind.value);
      box.hidden = !used;
      box.querySelectorAll("input, select, textarea").forEach((input) => { input.disabled = !used; });
    });
  };
  const showBenchmark = () => {
    const allowed = supported[benchmark.value] || [];
    let blocked = false;
    form.querySelectorAll("[name=settings]").forEach((box) => {
      const ok = allowed.includes(box.value);
      box.disabled = !ok;
      if (!ok) { box.checked = false; blocked = true; }
    });
    if (note) note.hidden = !blocked;
    if (example) example.href = example.dataset.base + "?benchmark=" + encodeURIComponent(benchmark.value);
  };
  const preset = form.querySelector("[name=preset]");
  const presetKinds = document.getElementById("preset-kinds");
  if (preset && presetKinds) {
    const kinds = JSON.parse(presetKinds.textContent);
    const fromPreset = () => { if (kinds[preset.value]) { kind.value = kinds[preset.value]; showKind(); } };
    preset.addEventListener("change", fromPreset);
    fromPreset();
  }
  kind.addEventListener("change", showKind);
  benchmark.addEventListener("change", showBenchmark);
  showKind();
  showBenchmark();
})();
