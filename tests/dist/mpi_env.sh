# tests/dist/mpi_env.sh — sourced, after tests/common/shell_test.sh, by the test scripts that start ranks with
# mpirun: Open MPI on loopback only, no high-speed transports to probe (quicker start-up, quieter logs), allowed as
# root in CI containers, and MPIRUN.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(mpirun --oversubscribe --bind-to none)
