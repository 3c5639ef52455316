// mailroom dashboard: confirmation before actions, and self-refresh of
// live pages (<main data-refresh="seconds">) without reloading the page.
"use strict";

document.addEventListener("submit", (ev) => {
  const question = ev.target.dataset.confirm;
  if (question && !window.confirm(question)) {
    ev.preventDefault();
  }
});

(() => {
  const main = document.querySelector("main[data-refresh]");
  if (!main) return;
  const every = Math.max(1, Number(main.dataset.refresh) || 5) * 1000;
  let timer = null;
  async function refresh() {
    if (document.hidden) return;
    try {
      const resp = await fetch(window.location.href, { credentials: "same-origin", cache: "no-store" });
      if (!resp.ok) return;
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const fresh = doc.querySelector("main");
      if (!fresh) return;
      main.innerHTML = fresh.innerHTML;
      if (!fresh.hasAttribute("data-refresh")) {
        main.removeAttribute("data-refresh");
        clearInterval(timer);
      }
    } catch (_) {
      // Offline for a moment: the next tick tries again.
    }
  }
  timer = setInterval(refresh, every);
})();
