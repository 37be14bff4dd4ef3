// Leaderboard column toggles: hidden columns are remembered in this browser.
(() => {
  const box = document.getElementById("column-toggles");
  const tables = document.querySelectorAll(".leaderboard-table");  // one per (benchmark, setting)
  if (!box) return;
  const KEY = "prbench.leaderboard.hidden";
  let hidden;
  try { hidden = new Set(JSON.parse(localStorage.getItem(KEY) || "[]")); } catch { hidden = new Set(); }
  const apply = () => {
    tables.forEach((table) => {
      table.querySelectorAll("[data-col]").forEach((cell) => { cell.hidden = hidden.has(cell.dataset.col); });
    });
  };
  box.querySelectorAll("input[type=checkbox]").forEach((input) => {
    input.checked = !hidden.has(input.value);
    input.addEventListener("change", () => {
      if (input.checked) hidden.delete(input.value); else hidden.add(input.value);
      localStorage.setItem(KEY, JSON.stringify([...hidden]));
      apply();
    });
  });
  apply();
})();
