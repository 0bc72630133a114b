"""slurm checks: does the SLURM allocation fit the launcher and the GPUs?

A package by topic: values.py (the job's SLURM values), gpus.py (the GPU allocation), launch.py (task
placement and who starts the ranks), launcher_alloc.py (a launcher's workers against the allocation),
lightning.py, cpus.py, script.py (the batch script as sbatch and bash read it), partition.py (the request
against the cluster's partition), rendezvous.py (a fixed rendezvous port on a shared node); _shared.py holds
the helpers they share. registry.load_all discovers the modules (nothing lists them).

Every check judges a JobShape (gpudoctor.job.shape): the live job when gpudoctor runs inside
one (`srun gpudoctor check`, or a preflight line in the batch script), or a batch script
before submission (`gpudoctor check --sbatch job.slurm`). The same rule, the same words.

Fixes to a batch script are `sbatch_set` actions: key = the long #SBATCH option, value = its
new value (None: remove the directive), target = the script (when gpudoctor runs inside a
job, the batch script SLURM recorded for it, from `scontrol show job`).

Behaviour encoded here, and where it was verified:
- SLURM sets SLURM_NTASKS in the batch shell only with --ntasks or --ntasks-per-node, always
  in srun tasks; SLURM_NTASKS_PER_NODE only with --ntasks-per-node; without --gpus-per-task
  every task of a step sees all the step's GPUs (checked against slurm-wlm 22.05 in the tests).
- Lightning (lightning.fabric.plugins.environments.slurm): SLURM is "detected" when
  SLURM_NTASKS is set and SLURM_JOB_NAME is not 'bash' or 'interactive'; then SLURM must
  start every rank (world size = SLURM_NTASKS), `--ntasks>1` without `--ntasks-per-node`
  raises RuntimeError, and (2.x) tasks per node must equal `devices` and nodes `num_nodes`
  (ValueError). Lightning 1.x only let SLURM manage tasks when SLURM_NTASKS equalled
  devices x num_nodes (_is_slurm_managing_tasks) and started its own processes otherwise;
  2.x does not, so `--ntasks=1` with 8 GPUs trains on one GPU (Lightning issues 17252, 18950).
- SLURM 22.05 release notes: srun no longer reads SLURM_CPUS_PER_TASK; --cpus-per-task must
  be given to srun again or exported as SRUN_CPUS_PER_TASK. SLURM 23.11 walked this back: srun
  reads SLURM_CPUS_PER_TASK again (SRUN_CPUS_PER_TASK deprecated; site docs of ULHPC, NERSC/WarpX
  and CSCS changed their templates accordingly). So only 22.05 to 23.02 drop the CPUs.
"""
