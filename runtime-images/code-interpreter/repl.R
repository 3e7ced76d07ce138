# The R context of the code interpreter (Debian packages no R Jupyter kernel): one R process per
# context, its global environment kept across executions. Each stdin line is
# "<code file> <setup file> <restore file> <token hex>": the setup file (Sys.setenv of the
# execution's env vars) is sourced, the code file's expressions run one by one in the global
# environment, a visible value printed (the last one becomes the execution's result, as
# IRkernel returns it), then the restore file puts the env vars back. A JSON report
# ({"result": mime bundle} or {"error": {name, value, traceback}}) goes to the fd named by
# AEGIS_CI_REPORT_FD, then the token on stdout and stderr (the server reads output up to it).

report_fd <- Sys.getenv("AEGIS_CI_REPORT_FD")
Sys.unsetenv("AEGIS_CI_REPORT_FD")
report_con <- file(paste0("/dev/fd/", report_fd), open = "w", raw = TRUE)

json_string <- function(s) {
  s <- enc2utf8(paste(s, collapse = "\n"))
  s <- gsub("\\", "\\\\", s, fixed = TRUE)
  s <- gsub("\"", "\\\"", s, fixed = TRUE)
  s <- gsub("\n", "\\n", s, fixed = TRUE)
  s <- gsub("\r", "\\r", s, fixed = TRUE)
  s <- gsub("\t", "\\t", s, fixed = TRUE)
  s <- gsub("[[:cntrl:]]", "", s)
  paste0("\"", s, "\"")
}

run_cell <- function(code_file) {
  exprs <- tryCatch(parse(code_file, keep.source = FALSE), error = function(e) e)
  if (inherits(exprs, "error")) {
    return(sprintf("{\"error\": {\"name\": \"SyntaxError\", \"value\": %s, \"traceback\": %s}}",
                   json_string(conditionMessage(exprs)), json_string(conditionMessage(exprs))))
  }
  last <- NULL
  outcome <- tryCatch({
    for (i in seq_along(exprs)) {
      shown <- withVisible(eval(exprs[[i]], envir = globalenv()))
      if (shown$visible) {
        text <- paste(capture.output(print(shown$value)), collapse = "\n")
        if (i == length(exprs)) last <- text else cat(text, "\n", sep = "")
      }
    }
    NULL
  }, error = function(e) {
    call <- conditionCall(e)
    value <- conditionMessage(e)
    where <- if (is.null(call)) value else paste0("Error in ", paste(deparse(call), collapse = " "), ": ", value)
    sprintf("{\"error\": {\"name\": \"Error\", \"value\": %s, \"traceback\": %s}}",
            json_string(value), json_string(where))
  }, interrupt = function(e) {
    "{\"error\": {\"name\": \"KeyboardInterrupt\", \"value\": \"interrupted\", \"traceback\": \"\"}}"
  })
  if (!is.null(outcome)) return(outcome)
  if (is.null(last)) return("{\"result\": null}")
  sprintf("{\"result\": {\"text/plain\": %s}}", json_string(last))
}

input <- file("stdin", open = "r")
repeat {
  line <- readLines(input, n = 1)
  if (length(line) == 0) quit(save = "no", status = 0)
  words <- strsplit(line, " ", fixed = TRUE)[[1]]
  if (length(words) != 4) next
  token <- paste0("\x1e", "AEGIS-END-", words[4], "\x1e")
  try(source(words[2], local = new.env()), silent = TRUE)
  answer <- run_cell(words[1])
  try(source(words[3], local = new.env()), silent = TRUE)
  unlink(words[1:3])
  flush(stdout())
  writeLines(answer, report_con)
  flush(report_con)
  cat(token)
  flush(stdout())
  cat(token, file = stderr())
  flush(stderr())
}
