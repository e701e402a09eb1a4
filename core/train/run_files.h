/* The files a run config names, checked before any work (`ctrl config check`). */
#ifndef CTRL_CORE_RUN_FILES_H
#define CTRL_CORE_RUN_FILES_H

#include <ctrl/option.h>
#include <ctrl/status.h>

/* [model] / [teacher] / [reward.NAME] path: a model directory whose config.json ctrl reads; [peft]
 * adapter_path: an adapter (adapter_config.json); [data] train_file / eval_file: data of the chosen split (a
 * file, a folder, a Hub dataset id in the local cache); chat_template_path: a file; [train]
 * resume_from_checkpoint: a checkpoint (trainer_state.json) unless "last". Every problem is
 * reported (CTRL_ERR_CONFIG), one line each, naming file:line (or --set) and the key. */
ctrl_status ctrl_run_files_check(const ctrl_config *cfg);

#endif
