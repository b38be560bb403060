#!/usr/bin/env python3
"""Writes bad/*.yaml: malformed variants of one valid config, as users get them wrong.

Each file starts with "# expect: LINE:COL: message" where LINE:COL is found by searching the
text for the marked token (the '@' in the marker), not by running lora-train; '*' for COL means
only the line is checked (YAML syntax errors, positioned by yaml-cpp), 0:0 that only the message
is checked. tests/config/test_config_errors.cpp loads every file and compares.
Run from this folder: python3 make_bad_configs.py
"""
import os

BASE = '''job: extension
config:
  name: bad_example
  process:
    - type: sd_trainer
      training_folder: output
      device: cpu
      network:
        type: lora
        linear: 8
      datasets:
        - folder_path: /data/images
          caption_ext: txt
          resolution: [512, 768]
      train:
        batch_size: 1
        steps: 500
        lr: 1e-4
        optimizer: adamw
        dtype: bf16
      model:
        name_or_path: /models/sd15.safetensors
        arch: sd1
      sample:
        sampler: ddim
        sample_every: 100
        prompts:
          - "a photo of [trigger]"
meta:
  name: "[name]"
'''

# name: (old text, new text, marker ('@' = the reported column; None = message only; a
#        marker ending in '*' checks the line only), expected message substring)
CASES = {
    'syntax_tab': ('        steps: 500\n', '        steps: 500\n\tlr_scheduler: constant\n',
                   '@\tlr_scheduler*', 'YAML syntax error'),
    'syntax_unclosed_list': ('resolution: [512, 768]', 'resolution: [512, 768', None, 'YAML syntax error'),
    'syntax_bad_indent': ('        steps: 500\n', '        steps: 500\n       lr_scheduler: constant\n',
                          '@       lr_scheduler*', 'YAML syntax error'),
    'unknown_key_typo': ('        batch_size: 1', '        bach_size: 1', '@bach_size',
                         "unknown key 'bach_size' in train (did you mean 'batch_size'?)"),
    'unknown_process_key': ('      device: cpu\n', '      device: cpu\n      trainig_folder: out\n',
                            '@trainig_folder', "did you mean 'training_folder'?"),
    'wrong_type_integer': ('steps: 500', 'steps: lots', 'steps: @lots',
                           "train.steps: expected an integer, got 'lots'"),
    'wrong_type_float_for_int': ('batch_size: 1', 'batch_size: 1.5', 'batch_size: @1.5',
                                 "expected an integer, got '1.5'"),
    'wrong_type_boolean': ('        steps: 500\n', '        steps: 500\n        gradient_checkpointing: maybe\n',
                           'gradient_checkpointing: @maybe', 'expected a boolean (true or false)'),
    'wrong_type_number': ('lr: 1e-4', 'lr: fast', 'lr: @fast', "train.lr: expected a number, got 'fast'"),
    'wrong_type_prompts_string': ('        prompts:\n          - "a photo of [trigger]"\n',
                                  '        prompts: "a photo of [trigger]"\n', 'prompts: @"a photo',
                                  'expected a list of strings'),
    'wrong_type_resolution_item': ('resolution: [512, 768]', 'resolution: [512, big]', '512, @big',
                                   "datasets.0.resolution: expected an integer, got 'big'"),
    'wrong_type_section': ('      network:\n        type: lora\n        linear: 8\n', '      network: lora\n',
                           'network: @lora', 'expected a mapping of keys'),
    'out_of_range_batch': ('batch_size: 1', 'batch_size: 0', 'batch_size: @0',
                           'out of range: must be between 1 and 1024, got 0'),
    'out_of_range_dropout': ('caption_ext: txt\n', 'caption_ext: txt\n          caption_dropout_rate: 1.5\n',
                             'caption_dropout_rate: @1.5', 'datasets.0.caption_dropout_rate: out of range'),
    'bad_dtype': ('dtype: bf16', 'dtype: bf17', 'dtype: @bf17',
                  "train.dtype: 'bf17' is not an allowed value (allowed: fp32, fp16, bf16, float32, float16, "
                  "bfloat16; did you mean 'bf16'?)"),
    'bad_device': ('device: cpu', 'device: gpu0', 'device: @gpu0', "'gpu0' is not a device"),
    'missing_name_or_path': ('        name_or_path: /models/sd15.safetensors\n', '', '@model:',
                             "model: missing required key 'name_or_path'"),
    'missing_model_section': ('      model:\n        name_or_path: /models/sd15.safetensors\n        arch: sd1\n', '',
                              '- @type: sd_trainer', "missing required section 'model'"),
    'empty_datasets': ('      datasets:\n        - folder_path: /data/images\n          caption_ext: txt\n'
                       '          resolution: [512, 768]\n', '      datasets: []\n', '@datasets:',
                       'at least one dataset is required'),
    'missing_folder_path': ('        - folder_path: /data/images\n          caption_ext: txt\n',
                            '        - caption_ext: txt\n', '- @caption_ext',
                            "datasets.0: missing required key 'folder_path'"),
    'not_yet_key': ('          caption_ext: txt\n', '          caption_ext: txt\n          is_reg: true\n',
                    'is_reg: @true',
                    "key 'datasets.0.is_reg' is an AI Toolkit setting that lora-train does not support yet"),
    'not_yet_value': ('optimizer: adamw', 'optimizer: prodigy', 'optimizer: @prodigy',
                      "'prodigy' is an AI Toolkit setting that lora-train does not support yet"),
    'not_yet_network_type': ('        type: lora\n', '        type: lorm\n', 'type: @lorm',
                             "'lorm' is an AI Toolkit setting that lora-train does not support yet"),
    'not_yet_wandb': ('meta:\n', '      logging:\n        use_wandb: true\nmeta:\n', 'use_wandb: @true',
                      "key 'logging.use_wandb' is an AI Toolkit setting that lora-train does not support yet"),
    'duplicate_key': ('        steps: 500\n', '        steps: 500\n        steps: 800\n', '        @steps: 800',
                      "key 'steps' appears twice in train (first on line"),
    'two_processes': ('meta:\n', '    - type: sd_trainer\n      training_folder: other\nmeta:\n',
                      '    - @type: sd_trainer\n      training_folder: other',
                      'lora-train runs one process per config'),
    'missing_job': ('job: extension\n', '', None, "missing required key 'job'"),
    'unknown_top_level': ('meta:\n', 'metta:\n  x: 1\nmeta:\n', '@metta',
                          "unknown key 'metta' in the top level (did you mean 'meta'?)"),
    'bad_job_kind': ('job: extension', 'job: generate', 'job: @generate',
                     "'generate' is an AI Toolkit setting that lora-train does not support yet"),
    'grad_accum_both': ('        steps: 500\n',
                        '        steps: 500\n        gradient_accumulation: 4\n        gradient_accumulation_steps: 2\n',
                        '@gradient_accumulation: 4',
                        'gradient_accumulation and gradient_accumulation_steps cannot both be set'),
    'qtype_ara': ('        arch: sd1\n', '        arch: sd1\n        qtype: "uint4|ostris/ara.safetensors"\n',
                  'qtype: @"uint4', 'accuracy-recovery adapters'),
    'bad_byte_size': ('meta:\n', '      memory:\n        simulate_vram: lots\nmeta:\n', 'simulate_vram: @lots',
                      'memory.simulate_vram: expected a size like 1.5GiB'),
    'name_with_slash': ('name: bad_example', 'name: runs/bad', 'name: @runs/bad', 'expected a plain folder name'),
    'list_item_not_mapping': ('        - folder_path: /data/images\n          caption_ext: txt\n'
                              '          resolution: [512, 768]\n', '        - /data/images\n', '- @/data/images',
                              'expected a mapping of keys (one item of datasets)'),
    'misplaced_key': ('          caption_ext: txt\n          resolution: [512, 768]\n',
                      '      caption_ext: txt\n      resolution: [512, 768]\n', '@caption_ext: txt',
                      "unknown key 'caption_ext' in the process ('caption_ext' belongs in datasets[]; "
                      "check the indentation)"),
    'misplaced_ambiguous_key': ('      device: cpu\n', '      device: cpu\n      dtype: bf16\n', '@dtype: bf16\n      network',
                                "('dtype' belongs in save, train or model; check the indentation)"),
    'old_int_spelling_ok_but_bad': ('steps: 500', 'steps: 5_0_0x', 'steps: @5_0_0x', "expected an integer, got '5_0_0x'"),
}

HEADER_LINES = 1
os.makedirs('bad', exist_ok=True)
for name, (old, new, marker, msg) in CASES.items():
    assert old in BASE, name
    text = BASE.replace(old, new, 1)
    if marker is None:
        where = '0:0'
    else:
        line_only = marker.endswith('*')
        marker = marker.rstrip('*')
        plain = marker.replace('@', '')
        pos = text.index(plain) + marker.index('@')
        line = text.count('\n', 0, pos) + 1 + HEADER_LINES
        col = pos - (text.rfind('\n', 0, pos) + 1) + 1
        where = f'{line}:*' if line_only else f'{line}:{col}'
    with open(os.path.join('bad', name + '.yaml'), 'w') as f:
        f.write(f'# expect: {where}: {msg}\n' + text)
print(f'wrote {len(CASES)} files')
