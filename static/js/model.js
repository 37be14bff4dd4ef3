// Model page: the compare form offers only the settings both models have. Each setting option
// lists (data-with) the other models that have it; picking another model disables the rest.
(function () {
  "use strict";
  var other = document.getElementById("compare-with");
  var setting = document.getElementById("compare-setting");
  if (!other || !setting) return;
  function sync() {
    var firstShared = null;
    Array.prototype.forEach.call(setting.options, function (option) {
      var shared = option.dataset.with.split(" ").indexOf(other.value) >= 0;
      option.disabled = !shared;
      option.hidden = !shared;
      if (shared && firstShared === null) firstShared = option;
    });
    if (setting.selectedOptions.length === 0 || setting.selectedOptions[0].disabled) {
      if (firstShared) firstShared.selected = true;
    }
  }
  other.addEventListener("change", sync);
  sync();
})();
