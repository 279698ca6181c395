// pgfifo dashboard: confirmation of actions and the optional auto-refresh.
(function () {
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });
  var box = document.getElementById("auto-refresh");
  if (!box) { return; }
  box.checked = window.localStorage.getItem("pgfifo-refresh") === "on";
  box.addEventListener("change", function () {
    window.localStorage.setItem("pgfifo-refresh", box.checked ? "on" : "off");
  });
  window.setInterval(function () {
    if (box.checked && !document.querySelector("input:focus")) {
      window.location.reload();
    }
  }, 5000);
})();
