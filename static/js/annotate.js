// Rating screen for annotators: fetches one blind pair at a time from the annotation API,
// keeps a draft on the server (PUT /api/annotation/drafts/<token>/, debounced, so any browser
// restores it) and in localStorage (keyed by the opaque assignment token), and counts active
// time. In "revise" mode (data-mode) it shows one rated pair, prefilled, and saves a revision.
// Responses are only ever "1" and "2": nothing here may hint at which one is which.
(function () {
  "use strict";

  var root = document.getElementById("annotate");
  if (!root) return;

  var IDLE_MS = 60 * 1000;         // no interaction for this long: the clock stops
  // The server refuses a rating with more active seconds than this (annotation.services.ratings.MAX_ACTIVE_SECONDS).
  var MAX_SECONDS = Number(root.dataset.maxSeconds) || 4 * 3600;
  var DRAFT_PREFIX = "prbench.draft.";
  var DRAFT_MAX_AGE_MS = 30 * 24 * 3600 * 1000;
  var RESPONSE_KEYS = ["1", "2"];
  var REVISE = root.dataset.mode === "revise";
  var SERVER_SAVE_MS = 800;         // a change is sent to the server this long after the last one
  var SERVER_SAVE_EVERY_MS = 30000; // and the active time at least this often while rating
  var narrow = window.matchMedia("(max-width: 860px)");

  function byId(id) { return document.getElementById(id); }

  var ui = {
    status: byId("status"), loading: byId("loading"), loadError: byId("load-error"),
    loadErrorText: byId("load-error-text"), retry: byId("retry-load"), noWork: byId("no-work"),
    pair: byId("pair"), questionTitle: byId("question-title"), question: byId("question"),
    profile: byId("profile"), rubric: byId("rubric"), form: byId("rating-form"),
    comment: byId("comment"), flagToggle: byId("flag-toggle"), flagBox: byId("flag-box"),
    flagReason: byId("flag-reason"), filled: byId("filled-count"), formError: byId("form-error"),
    submit: byId("submit"), openSkip: byId("open-skip"), loadAnother: byId("load-another"),
    progress: byId("progress"), progressText: byId("progress-text"),
    guidelines: byId("guidelines"), openGuidelines: byId("open-guidelines"),
    closeGuidelines: byId("close-guidelines"),
    skipDialog: byId("skip-dialog"), skipForm: byId("skip-form"), skipReason: byId("skip-reason"),
    skipFlag: byId("skip-flag"), skipError: byId("skip-error"), cancelSkip: byId("cancel-skip"),
    confirmSkip: byId("confirm-skip"), responses: byId("responses"),
    tabs: [byId("tab-1"), byId("tab-2")]
  };
  // Revise mode has no flag, skip or progress: stand-ins keep the code below uniform.
  function stub(tag) { var node = document.createElement(tag); node.hidden = true; return node; }
  if (!ui.flagToggle) { ui.flagToggle = stub("input"); ui.flagToggle.type = "checkbox"; }
  if (!ui.flagBox) ui.flagBox = stub("div");
  if (!ui.flagReason) ui.flagReason = stub("input");
  if (!ui.openSkip) ui.openSkip = stub("button");
  if (!ui.loadAnother) ui.loadAnother = stub("button");
  if (!ui.progress) { ui.progress = stub("progress"); ui.progressText = stub("span"); }
  if (!ui.skipDialog) {
    ui.skipDialog = stub("dialog"); ui.skipForm = stub("form"); ui.skipReason = stub("textarea");
    ui.skipFlag = stub("input"); ui.skipError = stub("p"); ui.cancelSkip = stub("button");
    ui.confirmSkip = stub("button");
  }

  var state = {
    pair: null,          // the API payload of the pair on screen
    fields: [],          // [{name: "ratings.1.factuality", response: "1", dim: "factuality", box: fieldset}]
    ratings: {"1": {}, "2": {}},
    current: 0,          // index into fields that digit keys rate; -1: none (focus is elsewhere)
    seconds: 0,          // active seconds on this pair
    started: false,      // guidelines acknowledged
    busy: false,
    returnFocus: null
  };

  // --- storage (localStorage can be full or disabled: drafts are a convenience) --------------
  function store(key, value) {
    try { window.localStorage.setItem(key, JSON.stringify(value)); } catch (e) { /* ignore */ }
  }
  function load(key) {
    try { return JSON.parse(window.localStorage.getItem(key) || "null"); } catch (e) { return null; }
  }
  function forget(key) {
    try { window.localStorage.removeItem(key); } catch (e) { /* ignore */ }
  }
  function pruneOldDrafts() {
    try {
      var now = Date.now();
      for (var i = window.localStorage.length - 1; i >= 0; i--) {
        var key = window.localStorage.key(i);
        if (key && key.indexOf(DRAFT_PREFIX) === 0) {
          var draft = load(key);
          if (!draft || !draft.saved || now - draft.saved > DRAFT_MAX_AGE_MS) forget(key);
        }
      }
    } catch (e) { /* ignore */ }
  }

  function hashText(text) {  // djb2: changed guidelines are shown again before rating
    var h = 5381;
    for (var i = 0; i < text.length; i++) h = ((h * 33) ^ text.charCodeAt(i)) >>> 0;
    return h.toString(36);
  }
  var guidelinesKey = "prbench.guidelines." + root.dataset.campaign + "." + root.dataset.user + "." +
    hashText(ui.guidelines.querySelector(".ann-prose").innerHTML);

  function draftKey() { return state.pair ? DRAFT_PREFIX + state.pair.assignment : null; }

  function draftBody() {
    return {
      ratings: state.ratings, comment: ui.comment.value, flag: ui.flagToggle.checked,
      flag_reason: ui.flagReason.value, seconds: Math.round(state.seconds * 10) / 10
    };
  }

  // Saves the draft in this browser at once and on the server shortly after (`changed`: the
  // annotator changed something, so the server copy is sent after SERVER_SAVE_MS of quiet;
  // otherwise only the active time moved, sent at most every SERVER_SAVE_EVERY_MS).
  function saveDraft(changed) {
    if (!state.pair || REVISE) return;
    accrue();
    var body = draftBody();
    body.saved = Date.now();
    store(draftKey(), body);
    if (changed === true) {
      state.edited = true;
      scheduleServerSave(SERVER_SAVE_MS);
    } else if (Date.now() - server.sentAt > SERVER_SAVE_EVERY_MS && state.edited) {
      scheduleServerSave(SERVER_SAVE_MS);
    }
  }

  // --- the server's copy of the draft ------------------------------------------------------------
  var server = {timer: null, sentAt: 0, inFlight: false, again: false};

  function draftUrl(token) { return root.dataset.draftUrl.replace("TOKEN", encodeURIComponent(token)); }

  function scheduleServerSave(delay) {
    if (server.timer) window.clearTimeout(server.timer);
    server.timer = window.setTimeout(sendServerDraft, delay);
  }

  function sendServerDraft(keepalive) {
    server.timer = null;
    if (!state.pair || REVISE || !state.edited) return;
    if (server.inFlight && !keepalive) { server.again = true; return; }
    server.inFlight = true;
    server.sentAt = Date.now();
    var token = state.pair.assignment;
    api(draftUrl(token), draftBody(), {method: "PUT", keepalive: !!keepalive}).then(function (result) {
      server.inFlight = false;
      if (result.status === 200 && state.pair && state.pair.assignment === token) {
        root.dataset.draftSaved = result.data.saved_at || "";
      }
      if (server.again) { server.again = false; scheduleServerSave(SERVER_SAVE_MS); }
    }).catch(function () {
      server.inFlight = false;  // offline: the copy in this browser stays; the next change retries
    });
  }

  function flushServerDraft() {
    if (server.timer) { window.clearTimeout(server.timer); sendServerDraft(true); }
  }

  // --- API --------------------------------------------------------------------------------
  function csrfToken() {
    var input = root.querySelector("input[name=csrfmiddlewaretoken]");
    if (input && input.value) return input.value;
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function api(url, body, extra) {
    var options = {credentials: "same-origin", headers: {"Accept": "application/json"}};
    if (body !== undefined) {
      options.method = (extra && extra.method) || "POST";
      options.headers["X-CSRFToken"] = csrfToken();
      if (body instanceof URLSearchParams) {
        options.body = body;
      } else {
        options.headers["Content-Type"] = "application/json";
        options.body = JSON.stringify(body);
      }
    }
    if (extra && extra.keepalive) options.keepalive = true;
    return fetch(url, options).then(function (response) {
      if (response.status === 204) return {status: 204, data: null};
      return response.json().catch(function () { return {}; }).then(function (data) {
        return {status: response.status, data: data || {}};
      });
    });
  }

  // --- small DOM helpers ----------------------------------------------------------------------
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) { node.setAttribute(name, attrs[name]); });
    [].concat(children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  function announce(text) {
    // Clear first so the same words are announced again.
    ui.status.textContent = "";
    window.setTimeout(function () { ui.status.textContent = text; }, 30);
  }

  function show(which) {
    ui.loading.hidden = which !== "loading";
    ui.pair.hidden = which !== "pair";
    ui.noWork.hidden = which !== "no-work";
    ui.loadError.hidden = which !== "error";
  }

  function setProgress(progress) {
    if (!progress) return;
    var done = Number(progress.done) || 0, target = Number(progress.target) || 0;
    ui.progress.max = Math.max(target, 1);
    ui.progress.value = Math.min(done, Math.max(target, 1));
    ui.progressText.textContent = done + " of " + target;
  }

  // --- the form ---------------------------------------------------------------------------------
  function buildScales(dimensions) {
    state.fields = [];
    RESPONSE_KEYS.forEach(function (response) {
      var container = byId("scales-" + response);
      Array.prototype.slice.call(container.querySelectorAll(".ann-dim")).forEach(function (old) { old.remove(); });
      dimensions.forEach(function (dim) {
        var name = "ratings." + response + "." + dim.key;
        var id = "r" + response + "-" + dim.key;
        var scale = el("div", {"class": "ann-scale"});
        for (var value = 1; value <= 5; value++) {
          var anchor = (dim.anchors || {})[String(value)] || "";
          scale.appendChild(el("label", {"class": "ann-option", "for": id + "-" + value}, [
            el("input", {type: "radio", name: id, id: id + "-" + value, value: String(value)}),
            el("span", {"class": "ann-num"}, String(value)),
            el("span", {"class": "ann-anchor"}, anchor)
          ]));
        }
        var box = el("fieldset", {"class": "ann-dim", "data-field": name, "aria-describedby": id + "-q"}, [
          el("legend", {}, [el("span", {"class": "visually-hidden"}, "Response " + response + ": "),
                            el("span", {"class": "ann-dim-label"}, dim.label || dim.key)]),
          el("p", {"class": "ann-dim-question", id: id + "-q"}, dim.question || ""),
          scale,
          el("p", {"class": "field-error ann-field-msg", id: id + "-msg"})
        ]);
        box.dataset.index = String(state.fields.length);
        container.appendChild(box);
        state.fields.push({name: name, response: response, dim: dim.key, box: box});
      });
    });
  }

  function fieldValue(field) { return state.ratings[field.response][field.dim]; }
  function firstUnrated(from) {
    for (var i = from || 0; i < state.fields.length; i++) if (fieldValue(state.fields[i]) === undefined) return i;
    return -1;
  }

  function updateFilled() {
    var done = state.fields.filter(function (f) { return fieldValue(f) !== undefined; }).length;
    ui.filled.textContent = done + " of " + state.fields.length + " rated";
    ui.filled.classList.toggle("is-complete", done === state.fields.length && done > 0);
    RESPONSE_KEYS.forEach(function (response) {
      var mine = state.fields.filter(function (f) { return f.response === response; });
      var rated = mine.filter(function (f) { return fieldValue(f) !== undefined; }).length;
      var count = byId("tab-" + response + "-count");
      if (count) count.textContent = rated + "/" + mine.length;
    });
  }

  // --- tabs (narrow screens show one response at a time) ---------------------------------------
  function setTab(response) {
    if (!ui.responses || ui.responses.dataset.tab === response) return;
    ui.responses.dataset.tab = response;
    ui.tabs.forEach(function (tab) {
      var on = tab.dataset.tab === response;
      tab.setAttribute("aria-selected", on ? "true" : "false");
      tab.tabIndex = on ? 0 : -1;
    });
  }
  ui.tabs.forEach(function (tab) {
    if (!tab) return;
    tab.addEventListener("click", function () {
      setTab(tab.dataset.tab);
      var first = state.fields.filter(function (f) { return f.response === tab.dataset.tab; })[0];
      if (first && state.current >= 0 && state.fields[state.current].response !== tab.dataset.tab) {
        setCurrent(Number(first.box.dataset.index));
      }
    });
    tab.addEventListener("keydown", function (event) {
      if (event.key !== "ArrowLeft" && event.key !== "ArrowRight") return;
      event.preventDefault();
      var other = ui.tabs[tab.dataset.tab === "1" ? 1 : 0];
      other.click();
      other.focus();
    });
  });

  function setCurrent(index) {
    state.current = index;
    state.fields.forEach(function (f, i) { f.box.classList.toggle("is-current", i === index); });
    if (index >= 0 && state.fields[index]) setTab(state.fields[index].response);
  }

  function focusField(index) {
    var field = state.fields[index];
    if (!field) return;
    setCurrent(index);
    var target = field.box.querySelector("input:checked") || field.box.querySelector("input");
    target.focus();
    field.box.scrollIntoView({block: "nearest"});
  }

  function clearFieldError(box) {
    box.classList.remove("is-missing", "has-error");
    var msg = box.querySelector(".ann-field-msg");
    if (msg) msg.textContent = "";
    box.querySelectorAll("[aria-invalid]").forEach(function (input) { input.removeAttribute("aria-invalid"); });
  }

  function clearErrors() {
    root.querySelectorAll(".is-missing, .has-error").forEach(clearFieldError);
    ui.formError.textContent = "";
    ui.loadAnother.hidden = true;
  }

  function record(field, value) {
    state.ratings[field.response][field.dim] = value;
    clearFieldError(field.box);
    if (!root.querySelector(".is-missing, .has-error")) ui.formError.textContent = "";
    updateFilled();
    saveDraft(true);
  }

  function rateWithKey(value) {
    var index = state.current;
    if (index < 0 || index >= state.fields.length) index = firstUnrated();
    if (index < 0) {
      announce("All " + state.fields.length + " fields are rated. Press Enter to submit.");
      return;
    }
    var field = state.fields[index];
    field.box.querySelector('input[value="' + value + '"]').checked = true;
    record(field, value);
    if (index + 1 < state.fields.length) {
      focusField(index + 1);
    } else {
      setCurrent(-1);
      ui.submit.focus();
    }
  }

  function resetForm() {
    state.ratings = {"1": {}, "2": {}};
    state.seconds = 0;
    ui.comment.value = "";
    ui.flagToggle.checked = false;
    ui.flagReason.value = "";
    ui.flagBox.hidden = true;
    clearErrors();
  }

  // Puts a draft ({ratings, comment, flag, flag_reason, seconds}) on the form; returns how
  // much it held (fields rated, or 1 for a comment alone).
  function applyDraft(draft) {
    if (!draft) return 0;
    var restored = 0;
    state.ratings = {"1": {}, "2": {}};
    state.fields.forEach(function (field) {
      var value = ((draft.ratings || {})[field.response] || {})[field.dim];
      var inputs = field.box.querySelectorAll("input");
      inputs.forEach(function (input) { input.checked = false; });
      if (typeof value === "number" && value >= 1 && value <= 5) {
        var input = field.box.querySelector('input[value="' + value + '"]');
        if (input) { input.checked = true; state.ratings[field.response][field.dim] = value; restored++; }
      }
    });
    ui.comment.value = draft.comment || "";
    ui.flagToggle.checked = !!draft.flag;
    ui.flagReason.value = draft.flag_reason || "";
    ui.flagBox.hidden = !ui.flagToggle.checked;
    state.seconds = Math.min(Number(draft.seconds) || 0, MAX_SECONDS);
    return restored || (draft.comment ? 1 : 0);
  }

  function restoreDraft() { return applyDraft(load(draftKey())); }

  // The server's copy wins when it is newer than this browser's (it was saved elsewhere) and
  // nothing has been touched on this pair since it was shown.
  function fetchServerDraft(pair) {
    var local = load(DRAFT_PREFIX + pair.assignment);
    return api(draftUrl(pair.assignment)).then(function (result) {
      if (result.status !== 200 || state.pair !== pair || state.edited) return false;
      var savedAt = Date.parse(result.data.saved_at || "") || 0;
      if (local && local.saved && local.saved >= savedAt) return false;
      var restored = applyDraft(result.data);
      var next = firstUnrated();
      setCurrent(next);
      updateFilled();
      store(DRAFT_PREFIX + pair.assignment, Object.assign({}, draftBody(), {saved: savedAt || Date.now()}));
      if (restored) announce("Your draft for this pair was restored from the server.");
      return restored > 0;
    }).catch(function () { return false; });
  }

  // --- loading pairs ------------------------------------------------------------------------------
  function renderPair(pair) {
    state.pair = pair;
    state.edited = false;
    resetForm();
    ui.question.textContent = pair.question || "";
    ui.profile.replaceChildren.apply(ui.profile, (pair.profile || []).map(function (post) {
      return el("li", {"class": "ann-post"}, [el("p", {}, post.text || "")]);
    }));
    var posts = (pair.profile || []).length;
    byId("profile-help").textContent = posts === 1 ? "One post." :
      posts + " posts, the most relevant to the question first.";
    byId("profile-count").textContent = "(" + posts + ")";
    var aspects = (pair.rubric || []).filter(function (a) { return a.aspect; });
    ui.rubric.replaceChildren.apply(ui.rubric, aspects.length ? aspects.map(function (a) {
      return el("li", {}, a.aspect);
    }) : [el("li", {"class": "muted"}, "No rubric aspects for this person.")]);
    (pair.responses || []).forEach(function (response) {
      var text = byId("response-" + response.key + "-text");
      if (text) text.textContent = response.text || "";
    });
    buildScales(pair.dimensions || []);
    var restored = REVISE ? applyDraft({ratings: pair.current, comment: pair.comment}) : restoreDraft();
    updateFilled();
    setProgress(pair.progress);
    show("pair");
    setTab("1");
    var next = REVISE ? 0 : firstUnrated();
    setCurrent(next);
    lastTick = Date.now();
    lastInteraction = Date.now();
    savedSecond = Math.floor(state.seconds);
    return restored;
  }

  function focusStart() {
    if (!ui.pair.hidden) {
      window.scrollTo(0, 0);
      ui.questionTitle.focus({preventScroll: true});
    } else if (!ui.noWork.hidden) {
      byId("no-work-title").focus();
    }
  }

  function loadNext(message) {
    state.pair = null;
    show("loading");
    return api(root.dataset.nextUrl + "?campaign=" + encodeURIComponent(root.dataset.campaign))
      .then(function (result) {
        if (result.status === 204) {
          show("no-work");
          ui.status.textContent = "";  // the focused heading says it
          if (state.started && !ui.guidelines.open) focusStart();
          return;
        }
        if (result.status !== 200) {
          throw new Error(result.data.detail || "The server answered " + result.status + ".");
        }
        var restored = renderPair(result.data);
        var parts = [];
        if (message) parts.push(message + " Here is the next pair.");
        if (restored) parts.push("Your draft for this pair was restored.");
        announce(parts.join(" "));
        if (state.started && !ui.guidelines.open) focusStart();
        fetchServerDraft(result.data);
      })
      .catch(function (error) {
        ui.loadErrorText.textContent = "Could not load the next pair: " +
          (error && error.message ? error.message : "network error") + " ";
        show("error");
      });
  }

  // --- submit ---------------------------------------------------------------------------------
  function fieldTarget(name) {
    // The most specific element for an API field name: "ratings.2.helpfulness", then "ratings.2", ...
    var parts = String(name || "").split(".");
    while (parts.length) {
      var found = root.querySelector('[data-field="' + parts.join(".") + '"]');
      if (found) return found;
      parts.pop();
    }
    return ui.formError;
  }

  function showError(name, message) {
    var target = fieldTarget(name);
    if (target === ui.formError) {
      ui.formError.textContent = message;
      ui.submit.focus();
      return;
    }
    target.classList.add("has-error");
    var msg = target.querySelector(".ann-field-msg");
    if (!msg) {
      msg = el("p", {"class": "field-error ann-field-msg"});
      target.appendChild(msg);
    }
    msg.textContent = message;
    ui.formError.textContent = message;
    var index = target.dataset.index;
    if (index !== undefined) { focusField(Number(index)); return; }
    var control = target.querySelector("input, textarea, select");
    if (control) control.focus();
    target.scrollIntoView({block: "center"});
  }

  function validate() {
    var missing = state.fields.filter(function (f) { return fieldValue(f) === undefined; });
    missing.forEach(function (field) {
      field.box.classList.add("is-missing");
      field.box.querySelector(".ann-field-msg").textContent = "Rate this";
      field.box.querySelectorAll("input").forEach(function (input) { input.setAttribute("aria-invalid", "true"); });
    });
    if (missing.length) {
      ui.formError.textContent = missing.length === 1 ? "One field is not rated yet: it is highlighted."
        : missing.length + " fields are not rated yet: they are highlighted.";
      var first = Number(missing[0].box.dataset.index);
      focusField(first);
      missing[0].box.scrollIntoView({block: "center"});
      return false;
    }
    if (ui.flagToggle.checked && !ui.flagReason.value.trim()) {
      showError("flag_reason", "Say what is wrong, or untick the flag.");
      return false;
    }
    return true;
  }

  function setBusy(busy) {
    state.busy = busy;
    ui.submit.disabled = busy;
    ui.submit.setAttribute("aria-busy", busy ? "true" : "false");
    ui.submit.textContent = busy ? "Saving…" : (REVISE ? "Save revision" : "Submit ratings");
  }

  function submitRevision() {
    var form = new URLSearchParams();
    state.fields.forEach(function (f) { form.append("r" + f.response + "-" + f.dim, String(fieldValue(f))); });
    form.append("comment", ui.comment.value);
    setBusy(true);
    api(root.dataset.reviseUrl, form).then(function (result) {
      setBusy(false);
      if (result.status === 200 && result.data.next) {
        window.location.assign(result.data.next);
        return;
      }
      var detail = result.data.detail || "The server answered " + result.status + ".";
      if (result.status === 400) showError(result.data.field, detail);
      else ui.formError.textContent = detail;
    }).catch(function () {
      setBusy(false);
      ui.formError.textContent = "Could not reach the server; try again.";
    });
  }

  function submit() {
    if (!state.pair || state.busy) return;
    if (ui.submit.disabled) return;
    clearErrors();
    if (!validate()) return;
    if (REVISE) { submitRevision(); return; }
    var pair = state.pair;
    saveDraft();
    if (server.timer) { window.clearTimeout(server.timer); server.timer = null; }
    state.edited = false;  // the submit clears the server's copy; nothing more to send
    setBusy(true);
    api(root.dataset.ratingsUrl, {
      assignment: pair.assignment,
      ratings: state.ratings,
      seconds: Math.round(state.seconds * 10) / 10,
      comment: ui.comment.value,
      flag_reason: ui.flagToggle.checked ? ui.flagReason.value.trim() : ""
    }).then(function (result) {
      setBusy(false);
      if (result.status === 200 || result.status === 201) {
        forget(DRAFT_PREFIX + pair.assignment);
        setProgress(result.data.progress);
        return loadNext("Saved.");
      }
      state.edited = true;  // refused: keep the server's copy up to date again
      var detail = result.data.detail || "The server answered " + result.status + ".";
      if (result.status === 400) {
        showError(result.data.field, detail);
      } else {
        // 409 (time ran out and the pair is full), 404, 403...: the draft stays in storage.
        ui.formError.textContent = detail + (result.status === 403 ? " (Are you still logged in?)" : "");
        ui.loadAnother.hidden = result.status !== 409 && result.status !== 404;
        (ui.loadAnother.hidden ? ui.submit : ui.loadAnother).focus();
      }
    }).catch(function () {
      setBusy(false);
      ui.formError.textContent = "Could not reach the server. Your draft is kept; try again.";
    });
  }

  // --- skip -------------------------------------------------------------------------------------
  function openSkip() {
    if (!state.pair || ui.skipDialog.open) return;
    state.returnFocus = document.activeElement;
    ui.skipError.textContent = "";
    ui.skipDialog.showModal();
    ui.skipReason.focus();
  }

  function confirmSkip() {
    var reason = ui.skipReason.value.trim();
    if (!reason) {
      ui.skipError.textContent = "Say why you skip this pair.";
      ui.skipReason.setAttribute("aria-invalid", "true");
      ui.skipReason.focus();
      return;
    }
    if (state.busy) return;
    var pair = state.pair;
    state.busy = true;
    ui.confirmSkip.disabled = true;
    if (server.timer) { window.clearTimeout(server.timer); server.timer = null; }
    api(root.dataset.skipUrl, {assignment: pair.assignment, reason: reason, flag: ui.skipFlag.checked})
      .then(function (result) {
        state.busy = false;
        ui.confirmSkip.disabled = false;
        if (result.status === 200) {
          forget(DRAFT_PREFIX + pair.assignment);
          ui.skipReason.value = "";
          ui.skipReason.removeAttribute("aria-invalid");
          ui.skipFlag.checked = false;
          state.returnFocus = null;
          ui.skipDialog.close();
          return loadNext("Skipped (undo it from “Your ratings”).");
        }
        ui.skipError.textContent = result.data.detail || "The server answered " + result.status + ".";
        ui.skipReason.focus();
      })
      .catch(function () {
        state.busy = false;
        ui.confirmSkip.disabled = false;
        ui.skipError.textContent = "Could not reach the server; try again.";
      });
  }

  // --- guidelines -------------------------------------------------------------------------------
  function openGuidelines() {
    if (ui.guidelines.open) return;
    state.returnFocus = document.activeElement;
    ui.guidelines.showModal();
    ui.closeGuidelines.focus();
  }

  function closeGuidelines() {
    if (ui.guidelines.open) ui.guidelines.close();
  }

  var startPressed = false;
  ui.guidelines.addEventListener("close", function () {
    var first = !state.started;
    if (first && !startPressed) {
      // Closed some other way (Escape where closedby is unsupported): the button is the way in.
      ui.guidelines.showModal();
      ui.closeGuidelines.focus();
      return;
    }
    if (first) {
      state.started = true;
      ui.guidelines.setAttribute("closedby", "closerequest");
      store(guidelinesKey, Date.now());
      ui.closeGuidelines.textContent = "Back to rating";
    }
    lastInteraction = Date.now();
    var back = state.returnFocus;
    state.returnFocus = null;
    if (!first && back && back !== document.body && document.contains(back)) back.focus();
    else focusStart();
  });
  ui.guidelines.addEventListener("cancel", function (event) {
    if (!state.started) event.preventDefault();  // the first time, "Start rating" must be pressed
  });
  ui.closeGuidelines.addEventListener("click", function () { startPressed = true; closeGuidelines(); });
  ui.openGuidelines.addEventListener("click", openGuidelines);

  ui.skipDialog.addEventListener("close", function () {
    var back = state.returnFocus;
    state.returnFocus = null;
    if (back && document.contains(back) && back !== document.body) back.focus();
  });

  // --- events -----------------------------------------------------------------------------------
  ui.form.addEventListener("submit", function (event) { event.preventDefault(); submit(); });
  ui.form.addEventListener("change", function (event) {
    var input = event.target;
    if (input.type !== "radio") return;
    var box = input.closest(".ann-dim");
    if (!box) return;
    record(state.fields[Number(box.dataset.index)], Number(input.value));
  });
  ui.form.addEventListener("focusin", function (event) {
    var box = event.target.closest(".ann-dim");
    if (box) setCurrent(Number(box.dataset.index));
    else if (event.target.matches("input, textarea, button, select")) setCurrent(-1);
  });
  ui.comment.addEventListener("input", function () { saveDraft(true); });
  ui.flagReason.addEventListener("input", function () { clearFieldError(ui.flagBox); saveDraft(true); });
  ui.flagToggle.addEventListener("change", function () {
    ui.flagBox.hidden = !ui.flagToggle.checked;
    if (ui.flagToggle.checked) ui.flagReason.focus();
    else clearFieldError(ui.flagBox);
    saveDraft(true);
  });
  ui.openSkip.addEventListener("click", openSkip);
  ui.cancelSkip.addEventListener("click", function () { ui.skipDialog.close(); });
  ui.skipForm.addEventListener("submit", function (event) { event.preventDefault(); confirmSkip(); });
  ui.skipReason.addEventListener("input", function () {
    ui.skipError.textContent = "";
    ui.skipReason.removeAttribute("aria-invalid");
  });
  ui.retry.addEventListener("click", function () { loadNext(); });
  ui.loadAnother.addEventListener("click", function () { loadNext(); });

  function isTyping(target) {
    if (!target || !target.tagName) return false;
    if (target.isContentEditable || target.tagName === "TEXTAREA" || target.tagName === "SELECT") return true;
    return target.tagName === "INPUT" && ["radio", "checkbox", "button", "submit", "reset"].indexOf(target.type) < 0;
  }

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.isComposing) return;
    var target = event.target;
    var modified = event.ctrlKey || event.metaKey || event.altKey;
    var dialogOpen = ui.guidelines.open || ui.skipDialog.open;

    if (event.key === "Enter") {
      if (ui.skipDialog.open) {
        if (target === ui.skipReason && (event.ctrlKey || event.metaKey)) {
          event.preventDefault();
          confirmSkip();
        }
        return;
      }
      if (dialogOpen || !state.pair || ui.pair.hidden) return;
      if (target.tagName === "TEXTAREA" && !(event.ctrlKey || event.metaKey)) return;  // a new line
      if (target.tagName === "BUTTON" || target.tagName === "A" || target.tagName === "SUMMARY") {
        if (!modified) return;  // let the button do its own thing
      }
      event.preventDefault();
      submit();
      return;
    }

    if (event.key === "Escape" && isTyping(target) && !dialogOpen && !modified) {
      // Leave the text box so digits rate and Enter submits again.
      event.preventDefault();
      target.blur();
      var index = firstUnrated();
      if (index >= 0) focusField(index);
      else { setCurrent(-1); ui.submit.focus(); }
      return;
    }

    if (modified || isTyping(target)) return;

    if (event.key === "?" || event.key === "g" || event.key === "G") {
      if (ui.skipDialog.open) return;
      event.preventDefault();
      if (ui.guidelines.open) { if (state.started) closeGuidelines(); }
      else openGuidelines();
      return;
    }
    if (dialogOpen || !state.pair || ui.pair.hidden) return;
    if (/^[1-5]$/.test(event.key)) {
      event.preventDefault();
      rateWithKey(Number(event.key));
    } else if ((event.key === "s" || event.key === "S") && !REVISE) {
      event.preventDefault();
      openSkip();
    }
  });

  // --- active time --------------------------------------------------------------------------------
  // A second counts only while the tab is visible and someone touched the page in the last minute.
  var lastTick = Date.now();
  var lastInteraction = Date.now();
  var savedSecond = 0;
  function touched() { lastInteraction = Date.now(); }
  ["keydown", "pointerdown", "pointermove", "wheel", "touchstart", "input", "focusin"].forEach(function (type) {
    document.addEventListener(type, touched, {passive: true, capture: true});
  });
  window.addEventListener("scroll", touched, {passive: true});
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "hidden") { saveDraft(); flushServerDraft(); }  // the time up to now
    lastTick = Date.now();
  });
  window.addEventListener("pagehide", function () { saveDraft(); flushServerDraft(); });
  function accrue() {
    var now = Date.now();
    var elapsed = Math.min(now - lastTick, 2000);  // a sleeping laptop is not work
    lastTick = now;
    if (!state.pair || !state.started || ui.pair.hidden || REVISE) return;
    if (document.visibilityState !== "visible" || now - lastInteraction > IDLE_MS) return;
    state.seconds = Math.min(state.seconds + elapsed / 1000, MAX_SECONDS);
  }
  window.setInterval(function () {
    accrue();
    if (state.pair && Math.floor(state.seconds) !== savedSecond) {
      savedSecond = Math.floor(state.seconds);
      saveDraft();
    }
  }, 1000);

  // --- start ------------------------------------------------------------------------------------
  if (narrow.matches) {
    // One column: the posts start folded so the responses and their scales come sooner.
    byId("profile-box").open = false;
  }
  if (REVISE) {
    state.started = true;
    ui.closeGuidelines.textContent = "Back to rating";
    var data = JSON.parse(byId("revise-data").textContent);
    renderPair(data);
    ui.questionTitle.focus({preventScroll: true});
    return;
  }
  pruneOldDrafts();
  if (load(guidelinesKey)) {
    state.started = true;
    ui.closeGuidelines.textContent = "Back to rating";
  } else {
    ui.guidelines.setAttribute("closedby", "none");
    ui.guidelines.showModal();
    ui.closeGuidelines.focus();
  }
  loadNext();
})();
